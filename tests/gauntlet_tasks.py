"""Tasks the gauntlet and the soak script enqueue: each leaves evidence that it ran; and the
failover tests' enqueuer, which leaves evidence of what it saw committed."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from django.db import DatabaseError, connection

from django_sqltasks.compat import task
from django_sqltasks.sql.broken import drop
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


ENQUEUE_PAUSE = 0.01  # seconds between the steady enqueuer's enqueues (about 100 a second)
ENQUEUE_BACKOFF = 0.2  # seconds before the steady enqueuer tries again after an error


def enqueue_steadily(log: str, acked: str, stop: str, seconds: float) -> None:
    """Enqueue ``mark_slowly(log, "e<n>", seconds)`` one task at a time (each in its own
    transaction) until the file ``stop`` exists. Each enqueue that returned (committed, as its
    caller sees it) adds a line to ``acked``: ``ok <label> <task id> <port of the server that
    took it>``; one that raised (its commit unknown) adds ``? <label> <error>``, and its label
    is not used again. A ``note`` (``enqueued``) follows each line, for a test to wake on."""
    n = 0
    with open(acked, "a") as out:
        while not os.path.exists(stop):
            label = f"e{n}"
            n += 1
            try:
                result = mark_slowly.enqueue(log, label, seconds)
                port = connection.connection.info.port
            except DatabaseError as e:
                out.write(f"? {label} {type(e).__name__}\n")
                out.flush()
                drop(connection)  # broken: the next enqueue opens a new one
                events.note("enqueued", label=label, port=None)
                time.sleep(ENQUEUE_BACKOFF)
                continue
            out.write(f"ok {label} {result.id} {port}\n")
            out.flush()
            events.note("enqueued", label=label, port=port)
            time.sleep(ENQUEUE_PAUSE)
