"""``tasks_worker --health-file``: a liveness probe's file, touched while the worker progresses."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from django_sqltasks.models import WorkerRecord
from tests.conftest import WorkerProcess, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker_process]

StartWorker = Callable[..., WorkerProcess]
FAST = {"SQLTASKS_LEASE_TIMEOUT": "2", "SQLTASKS_HEARTBEAT_INTERVAL": "0.2"}


def touched_again(path: Path) -> bool:
    """Whether ``path`` exists and is touched again within a second."""
    if not path.exists():
        return False
    before = path.stat().st_mtime_ns
    time.sleep(1)
    return path.stat().st_mtime_ns > before


@pytest.mark.parametrize("processes", [[], ["--processes", "2"]], ids=["one", "supervisor"])
def test_the_health_file_is_touched_at_each_heartbeat(
    worker_process: StartWorker, tmp_path: Path, processes: list[str]
) -> None:
    health = tmp_path / "health"
    worker = worker_process("--health-file", str(health), *processes, env=FAST)
    wait_for(health.exists, timeout=15)
    assert touched_again(health)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output


def test_a_frozen_child_stops_the_supervisors_health_file_and_its_lease(
    worker_process: StartWorker, tmp_path: Path
) -> None:
    health = tmp_path / "health"
    supervisor = worker_process("--processes", "2", "--health-file", str(health), env=FAST)
    wait_for(lambda: WorkerRecord.objects.count() == 2)
    wait_for(health.exists)
    frozen = int(re.findall(r"Started worker process pid=(\d+)", supervisor.output)[0])
    os.kill(frozen, signal.SIGSTOP)  # alive, but silent with no task running
    try:
        time.sleep(3)  # past LEASE_TIMEOUT
        assert not touched_again(health)
        # Its lease lapsed: its sibling's heartbeat forgot its row.
        wait_for(lambda: WorkerRecord.objects.count() == 1, timeout=10)
    finally:
        os.kill(frozen, signal.SIGCONT)
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0, supervisor.output
