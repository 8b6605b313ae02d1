"""Tasks the supervisor tests enqueue (tasks_worker --processes)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from django_sqltasks.compat import task
from tests import events


def _mark(path: str, what: str) -> None:
    """Append ``what`` and this process's pid to ``path``; tell the test (a ``note``)."""
    with Path(path).open("a") as f:
        f.write(f"{what} {os.getpid()}\n")
    events.note(what, path=path)


@task
def record(path: str, seconds: float = 0.0, gate: str = "") -> int:
    """Mark a start in ``path``, wait for ``gate`` to open (if one is given), sleep, mark the
    end; return the pid that ran it."""
    _mark(path, "start")
    if gate:
        events.wait_at(gate)
    time.sleep(seconds)
    _mark(path, "end")
    return os.getpid()


@task(timeout=1)
def sleep_past_timeout(path: str, seconds: float) -> None:
    _mark(path, "start")
    time.sleep(seconds)
    _mark(path, "end")


@task(timeout=1)
def spin_past_timeout(path: str, seconds: float) -> None:
    """Spin in pure Python (no sleep, no I/O) for ``seconds``."""
    _mark(path, "start")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass
    _mark(path, "end")


@task
def record_at_gate(path: str, gate: str) -> int:
    """Mark a start in ``path``, wait until the test opens ``gate``, mark the end; return the
    pid that ran it."""
    _mark(path, "start")
    events.wait_at(gate)
    _mark(path, "end")
    return os.getpid()


def _hold_gil_at_gate(path: str, gate: str) -> None:
    """Hold the GIL (every other thread of the process waits) until the test opens ``gate``."""
    _mark(path, "start")
    events.wait_at(gate, hold_gil=True)
    _mark(path, "end")


@task
def hold_gil(path: str, gate: str) -> None:
    _hold_gil_at_gate(path, gate)


@task(timeout=1)
def hold_gil_past_timeout(path: str, gate: str) -> None:
    _hold_gil_at_gate(path, gate)


@task
async def hold_gil_async(path: str, gate: str) -> None:
    """Hold the GIL from the event loop: the loop, and every thread, wait for it."""
    _hold_gil_at_gate(path, gate)


@task(timeout=1)
async def hold_gil_async_past_timeout(path: str, gate: str) -> None:
    _hold_gil_at_gate(path, gate)


@task(timeout=1)
async def await_past_timeout(path: str, seconds: float) -> None:
    """Wait without blocking the loop: its loop cancels it at its timeout."""
    _mark(path, "start")
    await asyncio.sleep(seconds)
    _mark(path, "end")


@task
def cpu(n: int) -> int:
    """A pure-Python loop: CPU-bound work that holds the GIL."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


@task
def grow(megabytes: int, path: str) -> None:
    """Keep ``megabytes`` MB alive in the worker process (a leak), and say which process."""
    _LEAK.append(b"\x01" * (megabytes << 20))  # written, so resident
    _mark(path, "grew")


_LEAK: list[bytes] = []


@task
def kill_worker(path: str, beside: int = 0, status: int = 1) -> None:
    """End the worker process with ``status`` (as a segfault or an OOM kill would, with no
    cleanup). The first time, once ``beside`` other tasks have started (so that they are
    running when the process dies); afterwards at once."""
    first = (
        not any(line.startswith("kill ") for line in Path(path).read_text().splitlines())
        if Path(path).exists()
        else True
    )
    _mark(path, "kill")
    deadline = time.monotonic() + 10
    while first and time.monotonic() < deadline:
        starts = [line for line in Path(path).read_text().splitlines() if line.startswith("start")]
        if len(starts) >= beside:
            break
        time.sleep(0.01)
    os._exit(status)


def _member_tenant(path: str, gate: str, tenant: str, kill: bool = False) -> str:
    return tenant


def _kill_or_wait(path: str, gate: str, kill: bool) -> None:
    """The poison of a batch (``kill``: end the worker once 3 others run beside it) or one of
    its innocents (wait at ``gate``)."""
    if kill:
        kill_worker.func(path, 3)
    else:
        record_at_gate.func(path, gate)


@task(fair_key=_member_tenant)
def fair_member(path: str, gate: str, tenant: str, kill: bool = False) -> None:
    _kill_or_wait(path, gate, kill)


@task(concurrency_limit=4)
def limited_member(path: str, gate: str, tenant: str, kill: bool = False) -> None:
    _kill_or_wait(path, gate, kill)
