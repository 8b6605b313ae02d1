"""The Django Tasks backend contract, point by point (see docs/guarantees.md).

Each test names the checklist point it covers: 1 signature, 2 validation, 3 flags, 4 results
and the enqueue signal, 5 get_result/refresh, 6 execution, 7 statuses, 8 errors as a list.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import pytest
from django.db import IntegrityError, transaction

from django_sqltasks import SQLTaskBackend
from django_sqltasks.compat import (
    BaseTaskBackend,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task_backends,
    task_finished,
    task_started,
)
from django_sqltasks.models import TaskRecord
from django_sqltasks.worker import Worker
from tests import tasks

RunWorker = Callable[..., Worker]
REFRESH_ATTRS = (
    "errors",
    "_return_value",
    "finished_at",
    "started_at",
    "last_attempted_at",
    "status",
    "enqueued_at",
    "worker_ids",
)


def test_1_signature_matches_the_base_class() -> None:
    assert issubclass(SQLTaskBackend, BaseTaskBackend)
    assert list(inspect.signature(SQLTaskBackend.__init__).parameters) == [
        "self",
        "alias",
        "params",
    ]
    assert list(inspect.signature(SQLTaskBackend.enqueue).parameters) == [
        "self",
        "task",
        "args",
        "kwargs",
    ]
    assert list(inspect.signature(SQLTaskBackend.get_result).parameters) == [
        "self",
        "result_id",
    ]


@pytest.mark.django_db
def test_1_enqueue_accepts_keywords_as_base_aenqueue_calls_it() -> None:
    backend = task_backends["default"]
    result = backend.enqueue(task=tasks.add, args=(1,), kwargs={"b": 2})
    assert result.args == [1] and result.kwargs == {"b": 2}


@pytest.mark.django_db(transaction=True)
async def test_2_validation_runs_in_aenqueue(settings: Any) -> None:
    from asgiref.sync import sync_to_async
    from django.db import connections

    from django_sqltasks.compat import InvalidTask

    task = tasks.noop.using(queue_name="other")
    settings.TASKS = {
        **settings.TASKS,
        "default": {**settings.TASKS["default"], "QUEUES": ["default"]},
    }
    with pytest.raises(InvalidTask, match="Queue 'other' is not valid"):
        await task.aenqueue()
    await sync_to_async(connections.close_all)()


def test_3_flags_are_declared() -> None:
    flags = {
        name: getattr(SQLTaskBackend, name)
        for name in (
            "supports_defer",
            "supports_async_task",
            "supports_get_result",
            "supports_priority",
        )
    }
    assert flags == dict.fromkeys(flags, True)


@pytest.mark.django_db
def test_4_enqueued_result_fields() -> None:
    result = tasks.add.enqueue(1, 2)
    assert result.status == TaskResultStatus.READY
    assert isinstance(result.id, str) and 0 < len(result.id) <= 64
    assert result.backend == "default"
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (None,) * 3
    assert result.errors == [] and result.worker_ids == []


@pytest.mark.django_db(transaction=True)
def test_5_get_result_is_fully_populated_and_refresh_copies_every_attr(
    run_worker: RunWorker,
) -> None:
    result = tasks.echo.enqueue(1, key=(2, 3))
    run_worker()
    fetched = tasks.echo.get_result(result.id)
    assert fetched.status == TaskResultStatus.SUCCESSFUL
    assert fetched.return_value == {"args": [1], "kwargs": {"key": [2, 3]}}
    assert fetched.args == [1] and fetched.kwargs == {"key": [2, 3]}
    assert fetched.enqueued_at and fetched.started_at and fetched.finished_at
    assert fetched.last_attempted_at
    assert len(fetched.worker_ids) == 1
    result.refresh()
    for attr in REFRESH_ATTRS:
        assert getattr(result, attr) == getattr(fetched, attr), attr


@pytest.mark.django_db
def test_5_unknown_id_raises_and_mismatched_task_raises() -> None:
    result = tasks.add.enqueue(1, 2)
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result("0190b6b3-0000-7000-8000-000000000000")
    with pytest.raises(TaskResultMismatch):
        tasks.noop.get_result(result.id)


@pytest.mark.django_db(transaction=True)
def test_6_execution_follows_the_contract(run_worker: RunWorker) -> None:
    seen: dict[str, Any] = {}

    def on_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.setdefault(
            "started",
            (
                sender,
                task_result.status,
                list(task_result.worker_ids),
                task_result.started_at,
                task_result.last_attempted_at,
            ),
        )

    def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.setdefault("finished", []).append(
            (sender, task_result.status, sys.exc_info()[0], task_result.errors)
        )

    task_started.connect(on_started)
    task_finished.connect(on_finished)
    try:
        ok = tasks.context_info.enqueue("x")
        worker = run_worker(concurrency=1)
        bad = tasks.fail.enqueue("contract")
        run_worker(concurrency=1)
    finally:
        task_started.disconnect(on_started)
        task_finished.disconnect(on_finished)
    sender, status, worker_ids, started_at, last_attempted_at = seen["started"]
    assert sender is SQLTaskBackend and status == TaskResultStatus.RUNNING
    assert worker_ids == [worker.worker_id]
    assert started_at is not None and last_attempted_at is not None
    assert tasks.context_info.get_result(ok.id).return_value["attempt"] == 1
    (s1, st1, exc1, _), (s2, st2, exc2, errors) = seen["finished"]
    assert (s1, st1, exc1) == (SQLTaskBackend, TaskResultStatus.SUCCESSFUL, None)
    assert (s2, st2, exc2) == (SQLTaskBackend, TaskResultStatus.FAILED, ValueError)
    assert errors[0].exception_class_path == "builtins.ValueError"
    assert errors[0].traceback.startswith("Traceback (most recent call last)")
    assert tasks.fail.get_result(bad.id).status == TaskResultStatus.FAILED


@pytest.mark.django_db
def test_7_only_the_four_statuses_can_be_stored() -> None:
    result = tasks.noop.enqueue()
    with pytest.raises(IntegrityError), transaction.atomic():
        TaskRecord.objects.filter(id=result.id).update(status="CANCELLED")
    assert set(TaskResultStatus.values) == {"READY", "RUNNING", "FAILED", "SUCCESSFUL"}


@pytest.mark.django_db
def test_8_errors_are_a_list_of_every_attempt() -> None:
    result = tasks.noop.enqueue()
    TaskRecord.objects.filter(id=result.id).update(
        status=TaskResultStatus.FAILED,
        worker_ids=["a", "b"],
        attempts=2,
        errors=[
            {"exception_class_path": "builtins.ValueError", "traceback": "one"},
            {"exception_class_path": "builtins.KeyError", "traceback": "two"},
        ],
    )
    fetched = tasks.noop.get_result(result.id)
    assert [e.exception_class_path for e in fetched.errors] == [
        "builtins.ValueError",
        "builtins.KeyError",
    ]
    assert fetched.attempts == 2
