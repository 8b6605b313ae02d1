"""Tasks the test suite enqueues."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

from django_sqltasks.compat import TaskContext, task
from tests import events

NOT_A_TASK = 42


@task
def enqueued_while_apps_are_narrowed() -> None:
    """tests/core/test_resolve.py's alone."""


@task
def noop() -> None:
    return None


@task
def add(a: int, b: int) -> int:
    return a + b


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task(tags=["billing", "tenant:acme"])
def tagged(order: str) -> str:
    return order


@task
def fail(message: str = "boom") -> None:
    raise ValueError(message)


@task
async def async_fail(message: str = "async boom") -> None:
    raise ValueError(message)


@task
def raise_system_exit() -> None:
    raise SystemExit(3)


@task
def raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


@task
def return_not_json() -> object:
    return {"when": object()}


@task(takes_context=True)
def context_info(context: TaskContext, label: str) -> dict[str, Any]:
    return {"id": context.task_result.id, "attempt": context.attempt, "label": label}


@task(takes_context=True)
async def async_context_info(context: TaskContext) -> dict[str, Any]:
    return {"id": context.task_result.id, "attempt": context.attempt}


@task
def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@task
async def async_sleep(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


@task(queue_name="other")
def other_queue() -> str:
    return "other"


@task(priority=10)
def important() -> str:
    return "important"


@task
def record(path: str, label: str, seconds: float = 0.0) -> str:
    """Append ``label`` and this process's pid to ``path``: evidence of each execution."""
    if seconds:
        time.sleep(seconds)
    with Path(path).open("a") as f:
        f.write(f"{label} {os.getpid()}\n")
    return label


def _touch(path: str) -> None:
    """Mark the start in ``path``; tell the test (a ``note``)."""
    with Path(path).open("a") as f:
        f.write(f"start {os.getpid()}\n")
    events.note("start", path=path)


@task
def touch_then_sleep(path: str, seconds: float) -> str:
    """Mark the start in ``path``, then sleep: lets a test kill the worker mid-task."""
    _touch(path)
    time.sleep(seconds)
    return "done"


@task
async def async_touch_then_sleep(path: str, seconds: float) -> str:
    _touch(path)
    await asyncio.sleep(seconds)
    return "done"


@task
def touch_then_wait_at(path: str, gate: str) -> str:
    """Mark the start in ``path``, then wait until the test opens ``gate``."""
    _touch(path)
    events.wait_at(gate)
    return "done"


@task
async def async_touch_then_wait_at(path: str, gate: str) -> str:
    _touch(path)
    await asyncio.to_thread(events.wait_at, gate)
    return "done"


@task
def count_rows() -> int:
    from django_sqltasks.models import TaskRecord

    return TaskRecord.objects.count()


@task
def clock() -> float:
    """Return when it ran: lets a test measure enqueue-to-start latency."""
    return time.time()


def _count_call(path: str) -> int:
    with Path(path).open("a") as f:
        f.write("call\n")
    return len(Path(path).read_text().splitlines())


@task(max_attempts=3, retry_backoff=0)
def flaky(path: str, fail_times: int) -> int:
    """Fail the first ``fail_times`` calls (counted in ``path``), then succeed."""
    calls = _count_call(path)
    if calls <= fail_times:
        raise ConnectionError(f"call {calls} fails")
    return calls


@task(max_attempts=3, retry_backoff=0)
async def flaky_async(path: str, fail_times: int) -> int:
    """``flaky``, run on the worker's event loop."""
    calls = _count_call(path)
    if calls <= fail_times:
        raise ConnectionError(f"call {calls} fails")
    return calls


@task(max_attempts=3, retry_backoff=0.4)
def flaky_with_backoff(path: str, fail_times: int) -> int:
    calls = _count_call(path)
    if calls <= fail_times:
        raise ConnectionError(f"call {calls} fails")
    return calls


@task(max_attempts=5, retry_backoff=0, retry_on=(ConnectionError,))
def fails_without_retry(path: str) -> None:
    _count_call(path)
    raise ValueError("not worth retrying")


@task(timeout=0.3)
def slow_sync(seconds: float) -> str:
    time.sleep(seconds)
    return "finished"


@task(timeout=0.3)
async def slow_async(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "finished"


@task(dedupe=True)
def refresh_report(report_id: int) -> int:
    return report_id


@task(dedupe=lambda user_id, **kwargs: f"user-{user_id}")
def sync_user(user_id: int, reason: str = "") -> str:
    return reason


@task
def tick(label: str = "tick") -> str:
    """Enqueued by the periodic tests' schedules."""
    return label


@task
async def long_async(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "finished"


class RunningCount:
    """How many of the ``counted`` tasks run at once in this process, and the most seen."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self._lock = threading.Lock()

    def enter(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self._lock:
            self.now -= 1


running_count = RunningCount()


@task
def counted(seconds: float) -> None:
    running_count.enter()
    try:
        time.sleep(seconds)
    finally:
        running_count.leave()


@task
async def async_counted(seconds: float) -> None:
    running_count.enter()
    try:
        await asyncio.sleep(seconds)
    finally:
        running_count.leave()


@task
def probe_latency(port: int) -> None:
    """Send this task's start time to ``port`` (UDP): scripts/latency_profile.py's probe."""
    import socket

    started = time.time()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(f"{started:.6f}".encode(), ("127.0.0.1", port))


@task
def query_then_wait_at(gate: str) -> bool:
    """Note ``started``, run a query (its thread takes a connection: from Django's pool where
    the worker has one), note ``queried``, then wait until the test opens ``gate``."""
    from django_sqltasks.models import TaskRecord

    events.note("started")
    TaskRecord.objects.exists()
    events.note("queried")
    events.wait_at(gate)
    return True
