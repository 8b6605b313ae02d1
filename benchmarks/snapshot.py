"""Benchmark one committed version of django-sqltasks, whatever the working tree holds.

The package is being edited in the same checkout while the suite runs; a run that picked up
half-edited files part-way through would mix versions. ``extract`` copies ``django_sqltasks/``
as of a git ref into a directory that the harness puts first on every subprocess's PYTHONPATH.

Where there is no git checkout (the bench image has no ``.git`` and no ``git``), the files are
the version: they cannot change under the run. The commit then comes from ``BENCH_COMMIT`` (the
image's build argument), and is "unknown" without it.
"""

from __future__ import annotations

import compileall
import io
import os
import shutil
import subprocess
import tarfile
from importlib import metadata
from pathlib import Path

from benchmarks.systems.base import REPO_ROOT

WORKTREE = "worktree"  # --core-ref value that means "use the files as they are"
HEAD = "HEAD"  # --core-ref's default
COMMIT_ENV = "BENCH_COMMIT"  # the commit of files that are not a git checkout
UNKNOWN = "unknown"


def in_git_checkout() -> bool:
    """Whether git and the checkout's ``.git`` are both here."""
    return shutil.which("git") is not None and (REPO_ROOT / ".git").exists()


def effective_ref(ref: str) -> str:
    """``ref``, or the working tree where the default HEAD has no git checkout to come from."""
    if in_git_checkout() or ref == WORKTREE:
        return ref
    if ref == HEAD:
        return WORKTREE
    raise SystemExit(f"--core-ref {ref} needs a git checkout; {REPO_ROOT} is not one")


def describe(ref: str) -> dict[str, str | bool | None]:
    """The commit behind ``ref`` and whether the package differs from it in the working tree
    (None where that cannot be told), with the installed package's version."""
    try:
        version: str | None = metadata.version("django-sqltasks")
    except metadata.PackageNotFoundError:
        version = None
    if not in_git_checkout():
        return {
            "ref": ref,
            "commit": os.environ.get(COMMIT_ENV) or UNKNOWN,
            "version": version,
            "worktree_dirty": None,
        }
    commit = _git("rev-parse", HEAD if ref == WORKTREE else ref).strip()
    dirty = bool(_git("status", "--porcelain", "--", "django_sqltasks").strip())
    return {"ref": ref, "commit": commit, "version": version, "worktree_dirty": dirty}


def commit(abbrev: int = 40) -> str:
    """The checkout's commit (its first ``abbrev`` digits), with "+dirty" where the package
    has uncommitted changes; else ``BENCH_COMMIT``, or "unknown"."""
    described = describe(HEAD)
    return f"{str(described['commit'])[:abbrev]}{'+dirty' if described['worktree_dirty'] else ''}"


def compile_sources() -> None:
    """Bytecode for the harness's own project (every system's settings and tasks import it)
    and the working tree's package, as installed packages have: where PYTHONDONTWRITEBYTECODE
    is set, each process would otherwise compile them again, in its cold start."""
    for package in ("benchmarks", "django_sqltasks"):
        compileall.compile_dir(REPO_ROOT / package, quiet=1)


def extract(ref: str, target: Path) -> Path | None:
    """Write ``django_sqltasks/`` at ``ref`` under ``target``; None means use the working tree."""
    if ref == WORKTREE:
        return None
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref, "django_sqltasks"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    # Installed packages come with bytecode; so must this copy, or every worker started from it
    # would pay for compiling it (PYTHONDONTWRITEBYTECODE keeps Python from caching it).
    compileall.compile_dir(target, quiet=1)
    return target


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout
