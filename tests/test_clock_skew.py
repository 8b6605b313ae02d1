"""Workers whose clocks are off by a minute, on a shared database: leases, rescues and deferred
tasks go by the database's clock, so nothing runs twice and nothing starts early.

The skewed worker runs under libfaketime (``libfaketimeMT``), which shifts the wall clock of
one process and leaves its monotonic clock alone, as a machine with a wrong clock would.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord
from tests import gauntlet_tasks
from tests.conftest import WorkerProcess, wait_for

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
    worker_process: StartWorker, tmp_path: Path, offset: str
) -> None:
    log = tmp_path / "executions"
    count = 24
    for i in range(count):
        gauntlet_tasks.mark_slowly.enqueue(str(log), f"t{i}", 3.0)
    deferred = gauntlet_tasks.mark.using(run_after=timezone.now() + timedelta(seconds=45)).enqueue(
        str(log), "deferred"
    )
    honest = worker_process(
        "--concurrency", "8", "--worker-id", "honest",
        env={"SQLTASKS_HEARTBEAT_INTERVAL": "1", "SQLTASKS_LEASE_TIMEOUT": "10"},
    )  # fmt: skip
    wait_for(lambda: len(gauntlet_tasks.executions(log)) >= 4, timeout=30)
    skewed = worker_process("--concurrency", "8", "--worker-id", "skewed", env=_skewed(offset))
    wait_for(lambda: TaskRecord.objects.succeeded().count() == count, timeout=60)
    time.sleep(2)  # a few more heartbeats of the skewed worker, rescuing if it would
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
    worker_process: StartWorker,
) -> None:
    """A worker 60 s ahead fires the slots of the database's clock, not its own: once it
    stops, an honest worker fires the next slots at once instead of a minute later."""
    ticks = TaskRecord.objects.filter(task_path="tests.tasks.tick")
    skewed = worker_process(
        "--worker-id", "skewed", env={**_skewed("+60s"), "SQLTASKS_PERIODIC_EVERY": "1"}
    )
    wait_for(lambda: ticks.count() >= 2, timeout=30)
    skewed.signal(signal.SIGTERM)
    assert skewed.wait(timeout=30) == 0, skewed.output
    before = ticks.count()
    honest = worker_process("--worker-id", "honest", env={"SQLTASKS_PERIODIC_EVERY": "1"})
    wait_for(lambda: ticks.count() >= before + 2, timeout=10)
    honest.signal(signal.SIGTERM)
    assert honest.wait(timeout=30) == 0, honest.output
