"""One attempt as the worker prepares it: the RUNNING TaskResult it builds, and the tasks and
policies it resolves once per task path and options, never for a path that does not resolve."""

from __future__ import annotations

import uuid
from dataclasses import fields
from datetime import timedelta

import pytest
from django.utils import timezone

from django_sqltasks.compat import TaskResult, TaskResultStatus, task_backends
from django_sqltasks.core.options import BackendOptions
from django_sqltasks.exceptions import TaskNotFound
from django_sqltasks.sql.rows import ClaimedRow
from django_sqltasks.task import errors_from_json
from django_sqltasks.worker import attempt as attempts

# Django 5.2's TaskResult comes from the django-tasks backport: its fields are checked there too.
pytestmark = pytest.mark.django_api

ERROR = {"exception_class_path": "builtins.ValueError", "traceback": "Traceback: boom"}


def _row(task_path: str = "tests.tasks.add", **fields: object) -> ClaimedRow:
    now = timezone.now()
    values: dict[str, object] = {
        "id": uuid.uuid4(),
        "task_path": task_path,
        "backend_name": "default",
        "queue_name": "default",
        "priority": 0,
        "args": [1, 2],
        "kwargs": {},
        "enqueued_at": now - timedelta(seconds=5),
        "run_after": None,
        "started_at": now - timedelta(seconds=1),
        "last_attempted_at": now,
        "errors": [ERROR],
        "worker_ids": ["w1", "w2"],
        "attempts": 2,
    }
    values.update(fields)
    return ClaimedRow(**values)


@pytest.fixture(autouse=True)
def _forget() -> None:
    attempts.forget_tasks()


def test_the_running_result_is_the_one_taskresult_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The result built field by field equals the one TaskResult() builds (the way taken if
    Django's TaskResult ever has other fields), on either source of TaskResult."""
    assert tuple(f.name for f in fields(TaskResult)) == attempts.RESULT_FIELDS
    row = _row()
    task = attempts.prepare(row, task_backends["default"].config).task
    direct = attempts.running_result(row, task)
    monkeypatch.setattr(attempts, "_DIRECT_RESULT", False)
    assert direct == attempts.running_result(row, task)
    assert (direct.id, direct.status, direct.args, direct.backend) == (
        str(row.id),
        TaskResultStatus.RUNNING,
        [1, 2],
        "default",
    )
    assert direct.attempts == 2 and not direct.is_finished and direct.finished_at is None
    assert direct.errors == errors_from_json([ERROR])
    assert direct.errors[0].traceback == "Traceback: boom"
    with pytest.raises(ValueError, match="not finished"):
        direct.return_value  # noqa: B018


def test_a_task_is_resolved_once_per_path_stored_options_and_backend_options() -> None:
    config = task_backends["default"].config
    first = attempts.prepare(_row(), config)
    assert attempts.prepare(_row(), config).task is first.task
    other_queue = attempts.prepare(_row(queue_name="other"), config)
    assert other_queue.task.queue_name == "other" and first.task.queue_name == "default"
    deferred = attempts.prepare(_row(run_after=timezone.now()), config)
    assert deferred.task.run_after is not None
    assert attempts.prepare(_row(), config).task.run_after is None
    # Options parsed again (a backend built with other settings) do not reuse the policy.
    retrying = BackendOptions.parse("default", {"MAX_ATTEMPTS": 3})
    assert attempts.prepare(_row(), retrying).policy.max_attempts == 3
    assert attempts.prepare(_row(), config).policy.max_attempts == first.policy.max_attempts == 1


def test_a_path_that_does_not_resolve_is_refused_each_time() -> None:
    config = task_backends["default"].config
    for _ in range(2):
        with pytest.raises(TaskNotFound, match="is not loaded and is not part of"):
            attempts.prepare(_row("this.s"), config)
        with pytest.raises(TaskNotFound, match="names a function, not a Task"):
            attempts.prepare(_row("tests.tasks.task"), config)
    assert attempts._prepared == {}
