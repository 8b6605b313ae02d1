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
from tests.conftest import WorkerProcess, wait_for

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


def _enqueue(marker: Path, status: int = 1) -> tuple[str, list[str]]:
    crasher = tasks.kill_worker.enqueue(str(marker), 3, status).id
    innocents = [tasks.record.enqueue(str(marker), 1.0).id for _ in range(3)]
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
    worker_process: StartWorker, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    crasher, innocents = _enqueue(marker)
    supervisor = worker_process(
        "--processes", "2", "-c", "4", "--prefetch", "0", "--worker-id", "suspects", env=ENV
    )
    wait_for(lambda: _finished([crasher, *innocents]), timeout=90)
    _assert_only_the_crasher_failed(crasher, innocents)
    assert "alone" in supervisor.output
    supervisor.stop()


def test_a_child_that_exits_zero_mid_task_has_its_tasks_rescued_at_once(
    worker_process: StartWorker, tmp_path: Path
) -> None:
    """Status 0 is no recycle when tasks were left RUNNING: they are rescued now, not after a
    lease (here 120 s, far beyond the wait)."""
    marker = tmp_path / "ran"
    crasher, innocents = _enqueue(marker, status=0)
    supervisor = worker_process(
        "--processes",
        "1",
        "-c",
        "4",
        "--prefetch",
        "0",
        env={**ENV, "SQLTASKS_LEASE_TIMEOUT": "120"},
    )
    wait_for(lambda: _finished([crasher, *innocents]), timeout=60)
    _assert_only_the_crasher_failed(crasher, innocents)
    supervisor.stop()


def test_a_restarted_single_worker_runs_the_suspects_alone(
    worker_process: StartWorker, tmp_path: Path
) -> None:
    """A single-process worker restarted under its own id (as a service manager does): it
    takes the dead one's name at once, as that process is gone from this host, and rescues
    its tasks instead of waiting for the lease (here 120 s)."""
    marker = tmp_path / "ran"
    crasher, innocents = _enqueue(marker)
    env = {**ENV, "SQLTASKS_LEASE_TIMEOUT": "120"}
    for _ in range(10):
        worker = worker_process("-c", "4", "--prefetch", "0", "--worker-id", "solo", env=env)

        def ended(w: WorkerProcess = worker) -> bool:
            return w.proc.poll() is not None or _finished([crasher, *innocents])

        wait_for(ended, timeout=60)
        if _finished([crasher, *innocents]):
            worker.stop()
            break
        assert worker.wait() == 1, worker.output  # killed by the task
    _assert_only_the_crasher_failed(crasher, innocents)
