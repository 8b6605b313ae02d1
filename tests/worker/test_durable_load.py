"""Durable tasks under load: thousands of tasks waiting for events at once, each resuming once
when its event comes or its timeout passes; the time from ``send_event`` to the task's next
line; and what one step costs. Each test prints its figures (run with ``-s``); WAITERS sets
how many wait (2,000 by default; the figures in docs/durable.md are of 10,000)."""

from __future__ import annotations

import os
import resource
import signal
import statistics
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_sqltasks import send_event
from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import StepRecord, TaskRecord
from django_sqltasks.sql import dialect_for
from django_sqltasks.worker import Worker
from tests import tasks_durable
from tests.conftest import WorkerProcess, wait_for
from tests.events import EventLog
from tests.tasks_durable import effects

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.load]

WAITERS = int(os.environ.get("WAITERS", "2000"))
PROBES = int(os.environ.get("PROBES", "100"))


def claim_ms(rounds: int = 50) -> float:
    """The mean time of a claim that finds nothing due, in milliseconds."""
    dialect = dialect_for(connection)
    started = time.perf_counter()
    for _ in range(rounds):
        with transaction.atomic(), connection.cursor() as cursor:
            assert not dialect.claim(
                cursor, backend_name="default", queue_names=["default"], worker_id="probe", limit=8
            )
    return (time.perf_counter() - started) / rounds * 1000


def sessions() -> int | None:
    """The database's sessions (PostgreSQL, MySQL); None on SQLite."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            )
        elif connection.vendor == "mysql":
            cursor.execute(
                "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE()"
            )
        else:
            return None
        return int(cursor.fetchone()[0])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def waiting_count() -> int:
    return StepRecord.objects.filter(state="waiting").count()


@pytest.mark.worker_process
def test_thousands_of_waiting_tasks_resume_once_each(
    worker_process: Callable[..., WorkerProcess], events: EventLog, tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    empty_claim = claim_ms()
    worker = worker_process("--concurrency", "16", "--worker-id", "w")
    events.wait("worker_started")
    idle_rss, idle_sessions = rss_mb(worker.proc.pid), sessions()
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((log, "order.paid", str(i), 3600), {}) for i in range(WAITERS)
    ]
    started = time.monotonic()
    results = tasks_durable.waiter.get_backend().enqueue_many(tasks_durable.waiter, calls)
    wait_for(lambda: waiting_count() == WAITERS, timeout=600, interval=0.5)
    parked_in = time.monotonic() - started
    waiting_rss, waiting_sessions = rss_mb(worker.proc.pid), sessions()
    parked_claim = claim_ms()
    assert TaskRecord.objects.filter(status="READY").count() == WAITERS
    # Half get their event; the other half's timeout passes (dated into the past).
    started = time.monotonic()
    for i in range(0, WAITERS, 2):
        send_event("order.paid", str(i), {"paid": i})
    sent_in = time.monotonic() - started
    timed_out = [r.id for r in results[1::2]]
    past = timezone.now() - timedelta(seconds=1)
    StepRecord.objects.filter(task_id__in=timed_out).update(wake_at=past)
    TaskRecord.objects.filter(pk__in=timed_out).update(available_at=past)
    wait_for(
        lambda: TaskRecord.objects.filter(status="SUCCESSFUL").count() == WAITERS,
        timeout=600,
        interval=0.5,
    )
    resumed_in = time.monotonic() - started
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    resumed = Counter(line for line in effects(log) if line.startswith("after:"))
    assert len(resumed) == WAITERS and set(resumed.values()) == {1}
    values = {str(k): v for k, v in TaskRecord.objects.values_list("id", "return_value")}
    for i, result in enumerate(results):
        assert values[str(result.id)] == ({"paid": i} if i % 2 == 0 else {"timed_out": str(i)})
    print(
        f"\n[{connection.vendor}] {WAITERS} waiting: parked in {parked_in:.1f}s; worker RSS "
        f"{idle_rss:.0f} MB idle, {waiting_rss:.0f} MB with them waiting; sessions "
        f"{idle_sessions} idle, {waiting_sessions} with them waiting; an empty claim "
        f"{empty_claim:.2f} ms on an empty table, {parked_claim:.2f} ms beside them; "
        f"{WAITERS // 2} events sent in {sent_in:.1f}s; all resumed in {resumed_in:.1f}s"
    )


@pytest.mark.worker_process
def test_the_time_from_send_event_to_the_tasks_next_line(
    worker_process: Callable[..., WorkerProcess], events: EventLog, tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    worker = worker_process("--concurrency", "4", "--worker-id", "w")
    events.wait("worker_started")
    latencies, starts, plain = [], [], []
    for i in range(PROBES):
        seen = events.mark()
        sent = time.monotonic()
        tasks_durable.noted.enqueue(f"plain{i}")
        plain.append(events.wait("note", what="started", key=f"plain{i}", after=seen)[0].at - sent)
        result = tasks_durable.waiter.enqueue(log, "probe", str(i))
        waiting = StepRecord.objects.filter(task_id=result.id, state="waiting")
        wait_for(waiting.exists, interval=0.01)
        seen = events.mark()
        sent = time.monotonic()
        send_event("probe", str(i), i)
        resumed = events.wait("note", what="resumed", key=str(i), after=seen)
        started = events.wait("note", what="started", key=str(i), after=seen)
        latencies.append(resumed[0].at - sent)
        starts.append(started[0].at - sent)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    ms = sorted(x * 1000 for x in latencies)
    p50, p95 = statistics.median(ms), ms[int(len(ms) * 0.95) - 1]
    start = sorted(x * 1000 for x in starts)
    print(
        f"\n[{connection.vendor}] send_event -> next line: p50 {p50:.1f} ms, p95 {p95:.1f} ms "
        f"(-> the task's first line: p50 {statistics.median(start):.1f} ms, "
        f"p95 {start[int(len(start) * 0.95) - 1]:.1f} ms; a plain enqueue -> its first line: "
        f"p50 {statistics.median(plain) * 1000:.1f} ms)"
    )


def test_the_cost_of_one_step(run_worker: Callable[..., Worker], tmp_path: Path) -> None:
    steps = 2000
    result = tasks_durable.timed_steps.enqueue(steps)
    run_worker()
    row = TaskRecord.objects.get(pk=result.id)
    assert row.status == TaskResultStatus.SUCCESSFUL, row.errors
    assert row.return_value is not None
    cpu_us, wall_us, plain_us = row.return_value
    assert StepRecord.objects.filter(task_id=result.id).count() == steps
    print(
        f"\n[{connection.vendor}] one step: {cpu_us:.0f} us of the worker's CPU, {wall_us:.0f} us "
        f"of wall time, one row written (a plain call: {plain_us:.2f} us); process CPU "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_utime:.1f}s"
    )
