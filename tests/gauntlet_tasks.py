"""Tasks the gauntlet and the soak script enqueue: each leaves evidence that it ran."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from django_sqltasks.compat import task
from tests import events


@task
def mark(path: str, label: str) -> str:
    """Append ``label`` and this process's pid to ``path``: one line per execution."""
    # One write() of one short line: O_APPEND keeps lines from several processes whole.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{label} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    return label


@task
def mark_slowly(path: str, label: str, seconds: float) -> str:
    """``mark``, then hold the slot for ``seconds``: keeps tasks in flight when a worker dies."""
    mark.func(path, label)
    threading.Event().wait(seconds)
    return label


@task
def mark_at_gate(path: str, label: str, gate: str) -> str:
    """``mark``, then hold the slot until the test opens ``gate`` (a ``note`` tells it)."""
    mark.func(path, label)
    events.note("at_gate", label=label)
    events.wait_at(gate)
    return label


@task
def size(payload: str) -> int:
    return len(payload)


@task
def big_result(size: int) -> str:
    return "x" * size


@task
def raise_memory_error() -> None:
    raise MemoryError("pretend the task exhausted memory")


@task
async def async_raise_system_exit() -> None:
    raise SystemExit(4)


@task
async def async_raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


@task
def never_returns(path: str) -> None:
    """Mark the start in ``path``, then block forever: what a hung task looks like."""
    mark.func(path, "never-returns")
    events.note("start")
    threading.Event().wait()


@task
async def async_never_returns(path: str) -> None:
    mark.func(path, "async-never-returns")
    events.note("start")
    await asyncio.Event().wait()


def executions(path: str | Path) -> list[str]:
    """The labels recorded in ``path``, one per execution, in the order they ran."""
    p = Path(path)
    return [line.split()[0] for line in p.read_text().splitlines()] if p.exists() else []


UNSTORABLE = {"nul": "a\x00b", "surrogate": "\ud800"}


@task
def return_unstorable(kind: str) -> str:
    """Return text a JSON column cannot hold: a NUL character, or a lone surrogate."""
    return UNSTORABLE[kind]
