"""A SIGKILL at every point of a three-step task: before each step, during it (its side effect
done), with its record written but not committed, and after it. The task is never lost, and a
step whose record committed never runs again; on every database."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import StepRecord, TaskRecord
from django_sqltasks.worker import Worker
from tests import tasks_durable
from tests.conftest import WorkerProcess, expire_lease
from tests.tasks_durable import effects

# Every point on PostgreSQL; the middle step's on every database (worker_process_core).
POINTS = [
    pytest.param(f"{point}:{i}", marks=[pytest.mark.worker_process_core] if i == 2 else [])
    for i in (1, 2, 3)
    for point in ("before", "during", "record", "after")
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker_process
@pytest.mark.parametrize("kill_at", POINTS)
def test_a_sigkill_never_runs_a_recorded_step_again_nor_loses_the_task(
    kill_at: str,
    worker_process: Callable[..., WorkerProcess],
    run_worker: Callable[..., Worker],
    tmp_path: Path,
) -> None:
    log = tmp_path / "log"
    result = tasks_durable.three_steps.enqueue(str(log), kill_at, str(tmp_path / "marker"))
    victim = worker_process("--concurrency", "1", "--worker-id", "victim")
    assert victim.wait() == -signal.SIGKILL, victim.output
    expire_lease("victim")
    run_worker()  # rescues the task, and runs it alone (it was running when its worker died)
    row = TaskRecord.objects.get(pk=result.id)
    assert row.status == TaskResultStatus.SUCCESSFUL, row.errors
    assert row.return_value == ["step1", "step2", "step3"]
    point, _, number = kill_at.partition(":")
    # A step killed before its record committed ran again (at least once); no other did.
    again = [f"step{number}"] if point in ("during", "record") else []
    assert sorted(effects(log)) == sorted(["step1", "step2", "step3", *again])
    assert list(
        StepRecord.objects.filter(task_id=result.id)
        .order_by("name")
        .values_list("name", "state", "attempts")
    ) == [("step1", "done", 1), ("step2", "done", 1), ("step3", "done", 1)]
