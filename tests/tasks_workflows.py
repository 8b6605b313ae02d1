"""Tasks the workflow tests chain and group."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from django.contrib.auth.models import Group

from django_sqltasks.compat import task
from tests import events


def note(marker: str, line: str) -> None:
    """Append ``line`` to the file ``marker``, on disk before the task goes on; tell the test
    (a ``note`` event)."""
    with Path(marker).open("a") as f:
        f.write(f"{line}\n")
        f.flush()
        os.fsync(f.fileno())
    events.note("line", line=line)


def hold_first_run(marker: str, line: str) -> None:
    """On the first run that noted ``line`` in ``marker``, block until the worker is killed
    (at most a minute); on a later run, go on at once."""
    if Path(marker).read_text().splitlines().count(line) == 1:
        threading.Event().wait(60)


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def double(x: int) -> int:
    return x * 2


@task
def total(results: list[int | None], failures: list[dict[str, Any]] | None = None) -> Any:
    return {"sum": sum(r for r in results if r is not None), "failures": failures}


@task
def sum_of(results: list[int]) -> int:
    return sum(results)


@task
def boom(*args: Any) -> None:
    raise ValueError("boom")


@task(max_attempts=3, retry_backoff=0)
def flaky(x: int, marker: str) -> int:
    """Fail the first attempt (a line in ``marker`` remembers it), then return ``x + 1``."""
    path = Path(marker)
    tried = path.exists()
    with path.open("a") as f:
        f.write("try\n")
    if not tried:
        raise ConnectionError("first attempt fails")
    return x + 1


@task
def record(value: Any, marker: str, seconds: float = 0) -> Any:
    """Append ``value`` to ``marker`` (one line per run), sleep, and return it."""
    note(marker, str(value))
    time.sleep(seconds)
    return value


@task
def record_results(results: list[Any], marker: str) -> int:
    """A group's callback: one line per run, then the count of results."""
    note(marker, "callback")
    return len(results)


@task(atomic=True)
def atomic_step(
    previous: Any, name: str, marker: str, seconds: float = 0, hold: bool = False
) -> str:
    """Create a row named ``name`` (a unique column: twice would fail), note the run in
    ``marker``, sleep (or ``hold`` its first run): all but the note in the task's
    transaction."""
    Group.objects.create(name=name)
    note(marker, name)
    time.sleep(seconds)
    if hold:
        hold_first_run(marker, name)
    return name


@task(atomic=True)
def atomic_fail(name: str) -> None:
    Group.objects.create(name=name)
    raise ValueError("after writing")


@task
def step(previous: Any, name: str, marker: str, seconds: float = 0, hold: bool = False) -> str:
    """A chain step: note the run in ``marker``, sleep (or ``hold`` its first run), return
    ``name``."""
    note(marker, name)
    time.sleep(seconds)
    if hold:
        hold_first_run(marker, name)
    return name


@task
def blob(chars: int, *own: Any) -> str:
    """Return a string of ``chars`` characters (a large result)."""
    return "x" * chars


@task
def blob_after(previous: Any, chars: int, *own: Any) -> str:
    """A chain step: return a string of ``chars`` characters."""
    return "x" * chars
