"""Cancelling tasks from Python: READY ones never run, RUNNING async ones are stopped."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from django_sqltasks.compat import TaskResultDoesNotExist, TaskResultStatus, task_backends
from django_sqltasks.models import TaskRecord
from django_sqltasks.worker import Worker
from tests import tasks
from tests.conftest import set_backend_options, wait_for, worker_thread
from tests.events import EventLog, Gate

pytestmark = pytest.mark.django_db


@pytest.mark.django_db(transaction=True)
def test_a_ready_task_cancelled_never_runs(run_worker: Callable[..., Worker]) -> None:
    result = tasks.add.enqueue(1, 2)
    assert task_backends["default"].cancel(result.id) is True
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 0
    assert result.errors[0].exception_class_path == "django_sqltasks.exceptions.TaskCancelled"


@pytest.mark.django_db(transaction=True)
def test_a_finished_task_cannot_be_cancelled(run_worker: Callable[..., Worker]) -> None:
    result = tasks.add.enqueue(1, 2)
    run_worker()
    assert task_backends["default"].cancel(result.id) is False
    assert tasks.add.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_unknown_id_raises() -> None:
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].cancel("01a1fd00-0000-7000-8000-000000000000")


def _fast_heartbeat(settings: Any) -> None:
    set_backend_options(settings, LEASE_TIMEOUT=2, HEARTBEAT_INTERVAL=0.2, MAX_ATTEMPTS=3)


@pytest.mark.django_db(transaction=True)
def test_a_running_async_task_is_cancelled_at_the_next_heartbeat(settings: Any) -> None:
    _fast_heartbeat(settings)
    result = tasks.long_async.enqueue(30)
    worker = Worker(queue_names=["*"], concurrency=2, burst=True)
    started = time.monotonic()
    with worker_thread(worker) as runner:
        wait_for(lambda: TaskRecord.objects.get(id=result.id).status == TaskResultStatus.RUNNING)
        assert task_backends["default"].cancel(result.id) is True
        runner.join(timeout=15)
    assert time.monotonic() - started < 10
    result.refresh()
    assert result.status == TaskResultStatus.FAILED  # not retried, although MAX_ATTEMPTS is 3
    assert result.attempts == 1
    assert result.errors[-1].exception_class_path == "django_sqltasks.exceptions.TaskCancelled"


@pytest.mark.django_db(transaction=True)
def test_a_prefetched_task_is_cancelled_before_it_starts(
    settings: Any, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    _fast_heartbeat(settings)
    first = tasks.touch_then_wait_at.using(priority=1).enqueue(str(tmp_path / "first"), gate.path)
    waiting = tasks.record.enqueue(str(tmp_path / "waiting"), "ran")
    worker = Worker(queue_names=["*"], concurrency=1, prefetch=1, burst=True)
    with worker_thread(worker) as runner:
        events.wait("note", what="start")
        assert worker.claimed == 2  # one claim took both: the second waits for the slot
        assert task_backends["default"].cancel(waiting.id) is True
        # Cancelled at the next heartbeat (looked at again at each one).
        events.until(
            lambda: TaskRecord.objects.get(id=waiting.id).status == TaskResultStatus.FAILED,
            "the prefetched task to be cancelled",
        )
        gate.open()
        runner.join(timeout=15)
    assert tasks.touch_then_wait_at.get_result(first.id).status == TaskResultStatus.SUCCESSFUL
    result = tasks.record.get_result(waiting.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "django_sqltasks.exceptions.TaskCancelled"
    assert "before it started" in result.errors[-1].traceback
    assert not (tmp_path / "waiting").exists(), "the cancelled task ran"
