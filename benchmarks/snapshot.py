"""Benchmark one committed version of django-sqltasks, whatever the working tree holds.

The package is being edited in the same checkout while the suite runs; a run that picked up
half-edited files part-way through would mix versions. ``extract`` copies ``django_sqltasks/``
as of a git ref into a directory that the harness puts first on every subprocess's PYTHONPATH.
"""

from __future__ import annotations

import compileall
import io
import subprocess
import tarfile
from pathlib import Path

from benchmarks.systems.base import REPO_ROOT

WORKTREE = "worktree"  # --core-ref value that means "use the files as they are"


def describe(ref: str) -> dict[str, str | bool]:
    """The commit behind ``ref`` and whether the package differs from it in the working tree."""
    commit = _git("rev-parse", "HEAD" if ref == WORKTREE else ref).strip()
    dirty = bool(_git("status", "--porcelain", "--", "django_sqltasks").strip())
    return {"ref": ref, "commit": commit, "worktree_dirty": dirty}


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
