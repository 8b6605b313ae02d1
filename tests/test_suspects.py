"""A task that kills its worker is the one charged: the tasks that ran beside it become
suspects, each runs alone next, and only a task whose worker dies while it runs alone is
charged a rescue (MAX_RESCUES). Real worker processes, as the crash is the subject."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord
from tests import tasks_processes as tasks
from tests.conftest import WorkerProcess
from tests.events import EventLog, Gate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker_process]

StartWorker = Callable[..., WorkerProcess]
# One rescue allowed: the crashing task dies once beside the others, once alone (charged 1),
# and fails the next time alone.
ENV = {
    "SQLTASKS_LEASE_TIMEOUT": "20",  # dead children are rescued at once; no lease runs out here
    "SQLTASKS_HEARTBEAT_INTERVAL": "0.25",
    "SQLTASKS_MAX_RESCUES": "1",
}
WORKER_LOST = "django_sqltasks.exceptions.WorkerLost"


def _finished(ids: list[str]) -> bool:
    return not TaskRecord.objects.filter(
        id__in=ids, status__in=[TaskResultStatus.READY, TaskResultStatus.RUNNING]
    ).exists()


def _enqueue(marker: Path, gate: Gate, status: int = 1) -> tuple[str, list[str]]:
    """A task that kills its worker once the three others run beside it; they wait at
    ``gate``, which the test opens once that worker is dead."""
    crasher = tasks.kill_worker.enqueue(str(marker), 3, status).id
    innocents = [tasks.record_at_gate.enqueue(str(marker), gate.path).id for _ in range(3)]
    return crasher, innocents


def _assert_only_the_crasher_failed(crasher: str, innocents: list[str]) -> None:
    for task_id in innocents:
        record = TaskRecord.objects.get(id=task_id)
        assert record.status == TaskResultStatus.SUCCESSFUL, record.errors
        assert record.rescues == 0, (record.errors, record.worker_ids)
    record = TaskRecord.objects.get(id=crasher)
    assert record.status == TaskResultStatus.FAILED
    assert record.errors[-1]["exception_class_path"] == WORKER_LOST
    assert "MAX_RESCUES is 1" in record.errors[-1]["traceback"]
    # Charged only for the deaths while it ran alone: never for the first, beside the others.
    assert record.rescues == 2
    assert "to run alone next time" in record.errors[0]["traceback"]


def test_under_a_supervisor_the_crashing_task_fails_alone(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    crasher, innocents = _enqueue(marker, gate)
    supervisor = worker_process(
        "--processes", "2", "-c", "4", "--prefetch", "0", "--worker-id", "suspects", env=ENV
    )
    events.wait("registered", count=3)  # a replacement: the first death's tasks were rescued
    gate.open()
    events.until(lambda: _finished([crasher, *innocents]), "every task to end", timeout=90)
    _assert_only_the_crasher_failed(crasher, innocents)
    assert "alone" in supervisor.output
    supervisor.stop()


def test_a_child_that_exits_zero_mid_task_has_its_tasks_rescued_at_once(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    """Status 0 is no recycle when tasks were left RUNNING: they are rescued now, not after a
    lease (here 120 s, far beyond the wait)."""
    marker = tmp_path / "ran"
    crasher, innocents = _enqueue(marker, gate, status=0)
    supervisor = worker_process(
        "--processes",
        "1",
        "-c",
        "4",
        "--prefetch",
        "0",
        env={**ENV, "SQLTASKS_LEASE_TIMEOUT": "120"},
    )
    events.wait("registered", count=2)  # a replacement: the first death's tasks were rescued
    gate.open()
    events.until(lambda: _finished([crasher, *innocents]), "every task to end")
    _assert_only_the_crasher_failed(crasher, innocents)
    supervisor.stop()


def test_a_restarted_single_worker_runs_the_suspects_alone(
    worker_process: StartWorker, gate: Gate, tmp_path: Path
) -> None:
    """A single-process worker restarted under its own id (as a service manager does): it
    takes the dead one's name at once, as that process is gone from this host, and rescues
    its tasks instead of waiting for the lease (here 120 s)."""
    marker = tmp_path / "ran"
    crasher, innocents = _enqueue(marker, gate)
    env = {**ENV, "SQLTASKS_LEASE_TIMEOUT": "120"}
    # Each time, a burst worker: it runs until the task kills it, or until nothing is left.
    for _ in range(10):
        worker = worker_process(
            "--burst", "-c", "4", "--prefetch", "0", "--worker-id", "solo", env=env
        )
        if worker.wait() == 0:
            break
        assert worker.wait() == 1, worker.output  # killed by the task
        gate.open()
    _assert_only_the_crasher_failed(crasher, innocents)
