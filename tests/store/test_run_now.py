"""Run now: a deferred READY task becomes due by the database's clock; from the backend and the
admin."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone

from django_sqltasks.compat import TaskResultDoesNotExist, TaskResultStatus, task_backends
from django_sqltasks.models import TaskRecord
from django_sqltasks.worker import Worker
from tests import tasks_flow
from tests.factories import staff_client, superuser_client, task_row

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_sqltasks_taskrecord_changelist"


def deferred() -> TaskRecord:
    later = timezone.now() + timedelta(hours=1)
    result = tasks_flow.default_queue_noop.using(run_after=later).enqueue()
    return TaskRecord.objects.get(pk=result.id)


@pytest.mark.django_db(transaction=True)
def test_a_deferred_task_runs_at_once(run_worker: Callable[..., Worker]) -> None:
    row = deferred()
    run_worker()  # not due: a burst worker leaves it
    row.refresh_from_db()
    assert row.status == TaskResultStatus.READY
    before = timezone.now()
    assert task_backends["default"].run_now(str(row.pk)) is True
    row.refresh_from_db()
    assert before - timedelta(seconds=5) <= row.available_at <= timezone.now()
    run_worker()
    row.refresh_from_db()
    assert row.status == TaskResultStatus.SUCCESSFUL


def test_a_task_due_already_keeps_its_place() -> None:
    row = task_row(available_at=timezone.now() - timedelta(hours=1))
    assert task_backends["default"].run_now(str(row.pk)) is True
    before = row.available_at
    row.refresh_from_db()
    assert row.available_at == before


@pytest.mark.parametrize("status", ["RUNNING", "SUCCESSFUL", "FAILED"])
def test_a_task_not_ready_is_left_alone(status: str) -> None:
    row = task_row(status, available_at=timezone.now() + timedelta(hours=1))
    assert task_backends["default"].run_now(str(row.pk)) is False
    before = row.available_at
    row.refresh_from_db()
    assert (row.status, row.available_at) == (status, before)


@pytest.mark.parametrize(
    "result_id", [pytest.param(str(uuid.uuid4()), id="unknown-uuid"), "not-a-uuid"]
)
def test_an_unknown_id_raises(result_id: str) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].run_now(result_id)


def test_another_backends_task_is_unknown() -> None:
    row = task_row(backend_name="elsewhere", available_at=timezone.now() + timedelta(hours=1))
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].run_now(str(row.pk))


def test_the_admin_action_runs_deferred_tasks_now() -> None:
    waiting, done = deferred(), task_row("SUCCESSFUL")
    response = superuser_client().post(
        reverse(CHANGELIST),
        {"action": "run_now", "_selected_action": [str(waiting.pk), str(done.pk)]},
        follow=True,
    )
    body = response.content.decode()
    assert "1 task(s) made due now" in body and "1 task(s) skipped" in body
    waiting.refresh_from_db()
    assert waiting.available_at <= timezone.now()
    assert "due now" in LogEntry.objects.get(object_id=str(waiting.pk)).change_message


def test_the_admin_action_needs_the_permission() -> None:
    waiting = deferred()
    client = staff_client("view_taskrecord")
    response = client.post(
        reverse(CHANGELIST), {"action": "run_now", "_selected_action": [str(waiting.pk)]}
    )
    assert response.status_code == 200  # the action is not offered: nothing done
    waiting.refresh_from_db()
    assert waiting.available_at > timezone.now()
