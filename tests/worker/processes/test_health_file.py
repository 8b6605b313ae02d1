"""``tasks_worker --health-file``: a liveness probe's file, touched while the worker progresses."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from django_sqltasks.models import WorkerRecord
from tests.conftest import WorkerProcess, expire_lease
from tests.events import EventLog

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker_process]

StartWorker = Callable[..., WorkerProcess]
FAST = {"SQLTASKS_LEASE_TIMEOUT": "2", "SQLTASKS_HEARTBEAT_INTERVAL": "0.2"}
ONE_SECOND_LEASE = {"SQLTASKS_LEASE_TIMEOUT": "1"}


@pytest.mark.parametrize("processes", [[], ["--processes", "2"]], ids=["one", "supervisor"])
def test_the_health_file_is_touched_at_each_heartbeat(
    worker_process: StartWorker, events: EventLog, tmp_path: Path, processes: list[str]
) -> None:
    health = tmp_path / "health"
    worker = worker_process("--health-file", str(health), *processes, env=FAST)
    first = events.wait("health_touched", path=str(health), timeout=15)[0]
    touched = health.stat().st_mtime_ns
    events.wait("health_touched", path=str(health), after=first.seq + 1, count=2)
    assert health.stat().st_mtime_ns > touched
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output


def test_a_frozen_child_stops_the_supervisors_health_file_and_its_lease(
    worker_process: StartWorker, events: EventLog, tmp_path: Path
) -> None:
    health = tmp_path / "health"
    supervisor = worker_process(
        "--processes", "2", "--health-file", str(health), env={**FAST, **ONE_SECOND_LEASE}
    )
    events.wait("registered", count=2)
    events.wait("health_touched")
    frozen = events.all("child_started")[0]
    frozen_at = events.mark()
    os.kill(frozen["pid"], signal.SIGSTOP)  # alive, but silent with no task running
    try:
        # Silent a lease long, it is no longer renewed; nor is the health file touched.
        lapsed = events.wait(
            "leases_renewed",
            lambda e: frozen["worker_id"] not in e["worker_ids"],
            after=frozen_at,
        )
        later = events.wait("leases_renewed", after=lapsed[0].seq + 1, count=2)
        assert all(frozen["worker_id"] not in e["worker_ids"] for e in later)
        assert not events.all("health_touched", after=lapsed[0].seq)
        # Its lease lapses (dated back, as it is no longer renewed): its sibling's heartbeat
        # forgets its row.
        expire_lease(frozen["worker_id"])
        events.until(
            lambda: not WorkerRecord.objects.filter(id=frozen["worker_id"]).exists(),
            "the frozen child's row to be forgotten",
        )
    finally:
        os.kill(frozen["pid"], signal.SIGCONT)
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0, supervisor.output
