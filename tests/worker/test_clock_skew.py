"""Workers whose clocks are off by a minute, on a shared database: leases, rescues and deferred
tasks go by the database's clock, so nothing runs twice and nothing starts early.

The skewed worker runs under libfaketime (``libfaketimeMT``), which shifts the wall clock of
one process and leaves its monotonic clock alone, as a machine with a wrong clock would.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord, WorkerRecord
from django_sqltasks.sql import dialect_for
from tests import gauntlet_tasks, tasks_flow, tasks_tools
from tests.conftest import ROOT, WorkerProcess, worker_env
from tests.events import EventLog, Gate

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
StartWorker = Callable[..., WorkerProcess]

pytestmark = [
    pytest.mark.skipif(
        connection.vendor == "sqlite", reason="SQLite is one machine's database: one clock"
    ),
    pytest.mark.skipif(not FAKETIME.exists(), reason="libfaketime is not installed"),
    pytest.mark.django_db(transaction=True),
]


def _skewed(offset: str) -> dict[str, str]:
    return {
        "LD_PRELOAD": str(FAKETIME),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "SQLTASKS_HEARTBEAT_INTERVAL": "1",
        "SQLTASKS_LEASE_TIMEOUT": "10",
    }


@pytest.mark.parametrize("offset", ["+60s", "-60s"])
def test_a_worker_with_a_wrong_clock_rescues_nothing_live_and_starts_nothing_early(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path, offset: str
) -> None:
    log = tmp_path / "executions"
    count = 24
    for i in range(count):
        gauntlet_tasks.mark_at_gate.enqueue(str(log), f"t{i}", gate.path)
    deferred = gauntlet_tasks.mark.using(run_after=timezone.now() + timedelta(seconds=45)).enqueue(
        str(log), "deferred"
    )
    honest = worker_process(
        "--concurrency", "8", "--worker-id", "honest",
        env={"SQLTASKS_HEARTBEAT_INTERVAL": "1", "SQLTASKS_LEASE_TIMEOUT": "10"},
    )  # fmt: skip
    events.wait("note", what="at_gate", count=4, timeout=30)
    often = {"SQLTASKS_HEARTBEAT_INTERVAL": "0.25"}
    skewed = worker_process(
        "--concurrency", "8", "--worker-id", "skewed", env={**_skewed(offset), **often}
    )
    # Both run tasks (which wait at the gate), and the skewed worker looks for dead workers'
    # tasks again and again while the honest one's run: it would rescue them if it went by
    # its own clock.

    def watched() -> bool:
        if events.all("rescue_pass", lambda e: e["count"] > 0):
            return True  # wrongly: the assertions below say so
        running = len(events.all("note", what="at_gate"))
        return running >= 16 and len(events.all("rescue_pass", worker_id="skewed")) >= 5

    events.until(watched, "16 running tasks and five rescue passes of the skewed worker")
    gate.open()
    events.until(lambda: TaskRecord.objects.succeeded().count() == count, "every task to end")
    deferred_status = TaskRecord.objects.get(id=deferred.id).status
    for worker in (honest, skewed):
        worker.signal(signal.SIGTERM)
    for worker in (honest, skewed):
        assert worker.wait(timeout=30) == 0, worker.output
    executions = Counter(gauntlet_tasks.executions(log))
    assert [label for label, n in executions.items() if n > 1] == [], "a task ran twice"
    assert "Rescued" not in skewed.output + honest.output
    assert deferred_status == TaskResultStatus.READY, "a task deferred 45 s started early"
    assert "deferred" not in executions
    assert not TaskRecord.objects.filter(errors__contains="WorkerLost").exists() or (
        connection.vendor != "postgresql"
    )


def test_periodic_slots_go_on_after_a_worker_with_a_fast_clock_stops(
    worker_process: StartWorker, events: EventLog
) -> None:
    """A worker 60 s ahead fires the slots of the database's clock, not its own: once it
    stops, an honest worker fires the next slots at once instead of a minute later."""
    ticks = TaskRecord.objects.filter(task_path="tests.tasks.tick")
    skewed = worker_process(
        "--worker-id", "skewed", env={**_skewed("+60s"), "SQLTASKS_PERIODIC_EVERY": "1"}
    )
    events.wait("task_finished", task="tests.tasks.tick", count=2, timeout=30)
    skewed.signal(signal.SIGTERM)
    assert skewed.wait(timeout=30) == 0, skewed.output
    before = ticks.count()
    honest = worker_process("--worker-id", "honest", env={"SQLTASKS_PERIODIC_EVERY": "1"})
    events.until(lambda: ticks.count() >= before + 2, "two more slots", timeout=10)
    honest.signal(signal.SIGTERM)
    assert honest.wait(timeout=30) == 0, honest.output


def _database_now() -> datetime:
    with connection.cursor() as cursor:
        return dialect_for(connection).db_now(cursor)


def _run_skewed(offset: str, code: str) -> str:
    """Run ``code`` in a Django process on the test database whose clock is off by
    ``offset``; return what it printed."""
    script = f"import django\ndjango.setup()\n{code}"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=worker_env(**_skewed(offset)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


ENQUEUES = {
    "enqueue": "print(tasks.add.enqueue(1, 2).id)",
    # COPY on PostgreSQL: the row's values are sent, not SQL.
    "enqueue_many": "print(*(r.id for r in tasks.add.get_backend().enqueue_many("
    "tasks.add, [((1, 2), {}), ((3, 4), {})])))",
    "aenqueue": "import asyncio\nprint(asyncio.run(tasks.add.aenqueue(1, 2)).id)",
}


@pytest.mark.parametrize("entry", sorted(ENQUEUES))
def test_a_task_enqueued_from_a_fast_host_is_due_at_once(entry: str) -> None:
    """A host whose clock is 60 s ahead enqueued tasks that no worker took for a minute:
    their due time was the host's "now". It is the database's."""
    printed = _run_skewed("+60s", f"from tests import tasks\n{ENQUEUES[entry]}")
    ids = printed.split()
    assert ids
    now = _database_now()
    for row in TaskRecord.objects.filter(id__in=ids):
        assert row.available_at <= now, f"due {row.available_at - now} from now"
        assert row.enqueued_at > now + timedelta(seconds=30)  # the host's clock, for people


@pytest.mark.parametrize("kind", ["snooze", "retry"])
def test_a_worker_with_a_slow_clock_waits_out_snoozes_and_retries_by_the_database(
    worker_process: StartWorker, events: EventLog, tmp_path: Path, kind: str
) -> None:
    """A worker 60 s behind ran Snooze(30) again at once (21 times in 20 s): it computed the
    due time from its own clock. The database adds the delay to its own."""
    if kind == "snooze":
        result = tasks_flow.snooze_once.enqueue(str(tmp_path / "calls"), 30.0)
    else:
        result = tasks_tools.fails_with_backoff.enqueue()  # the first retry is 30 to 60 s away
    row = TaskRecord.objects.filter(id=result.id)
    worker = worker_process("--worker-id", "slow", env=_skewed("-60s"))
    ran = row.filter(worker_ids__contains=["slow"]).exclude(status=TaskResultStatus.RUNNING)
    events.until(ran.exists, "the task's first run to end", timeout=30)
    due_in = row.get().available_at - _database_now()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output
    # Less the time between the write and this read: well under 10 s.
    assert due_in > timedelta(seconds=20), f"due in {due_in}"
    record = row.get()
    assert record.status == TaskResultStatus.READY
    assert (record.snoozes, record.attempts) == ((1, 0) if kind == "snooze" else (0, 1))


def test_an_admin_with_a_fast_clock_keeps_a_live_worker_s_row(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    """An admin host 60 s ahead deleted a live worker's row (its heartbeat looked a minute
    old), and the worker's running tasks ran a second time. Liveness is read by the
    database's clock."""
    log = tmp_path / "executions"
    for i in range(4):
        gauntlet_tasks.mark_at_gate.enqueue(str(log), f"t{i}", gate.path)
    honest = worker_process(
        "--concurrency", "4", "--worker-id", "honest",
        env={"SQLTASKS_HEARTBEAT_INTERVAL": "1", "SQLTASKS_LEASE_TIMEOUT": "10"},
    )  # fmt: skip
    events.wait("note", what="at_gate", count=4)
    started = WorkerRecord.objects.get(id="honest").started_at
    kept = _run_skewed(
        "+60s",
        "from django.contrib import admin\n"
        "from django_sqltasks import admin as _\n"
        "from django_sqltasks.models import WorkerRecord\n"
        "admin.site._registry[WorkerRecord].delete_queryset(None, WorkerRecord.objects.all())\n"
        "print(WorkerRecord.objects.filter(id='honest').exists())",
    )
    assert kept.split() == ["True"], "a live worker's row was deleted"
    assert WorkerRecord.objects.get(id="honest").started_at == started
    gate.open()
    events.wait("task_finished", count=4)
    honest.signal(signal.SIGTERM)
    assert honest.wait(timeout=30) == 0, honest.output
    assert sorted(Counter(gauntlet_tasks.executions(log)).values()) == [1, 1, 1, 1]
