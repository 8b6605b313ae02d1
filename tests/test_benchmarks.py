"""The benchmark harness's command line where its dependencies are missing, as in the venv the
README's commands build (no psutil, rich or peers): its help lists every command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Modules the harness's commands need that the README's venv does not have.
MISSING = ("psutil", "rich", "celery", "rq", "redis", "matplotlib", "uvicorn", "django_tasks_db")


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks ARGS`` with MISSING unimportable."""
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in MISSING)
    code = f"import runpy, sys; {blocked}; sys.argv[1:] = {list(args)!r}; "
    code += "runpy.run_module('benchmarks', run_name='__main__', alter_sys=True)"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_help_works_without_the_benchmarks_dependencies_and_lists_every_command() -> None:
    done = harness("--help")
    assert done.returncode == 0, done.stderr
    for command in ("run", "report", "setup", "roundtrips", "summarize", "scale", "mixed"):
        assert command in done.stdout, command
    run = harness("run", "--help")
    assert run.returncode == 0, run.stderr
    flat = " ".join(run.stdout.split())
    assert "fairness, waiters" in flat and "--keep-databases" in flat
    assert "not comparable with the published ones" in flat


def test_a_command_that_needs_a_missing_module_says_which_and_how_to_install_it() -> None:
    done = harness("run", "--smoke")
    assert done.returncode == 1
    assert "python -m benchmarks run needs rich" in done.stderr, done.stderr
    assert "WITH_BENCH=1 scripts/venv.sh" in done.stderr
    assert "Traceback" not in done.stderr
