"""Admin actions: retry, cancel and delete, each permission-checked and logged."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord
from django_sqltasks.store.control import CANCELLED
from django_sqltasks.worker import Worker
from tests.factories import staff_client, task_row

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_sqltasks_taskrecord_changelist"


@pytest.fixture
def superuser_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    return client


def act(client: Client, action: str, *records: TaskRecord, **extra: str) -> str:
    response = client.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": [str(r.pk) for r in records], **extra},
        follow=True,
    )
    assert response.status_code == 200
    return response.content.decode()


def test_retry_puts_failed_tasks_back_keeping_their_history(superuser_client: Client) -> None:
    failed = task_row(TaskResultStatus.FAILED)
    done = task_row(TaskResultStatus.SUCCESSFUL)
    body = act(superuser_client, "retry_tasks", failed, done)
    assert "1 task(s) retried" in body and "1 task(s) skipped" in body
    failed.refresh_from_db()
    assert failed.status == TaskResultStatus.READY
    assert failed.finished_at is None
    assert failed.attempts == 1 and failed.worker_ids == ["w1"]
    assert failed.errors[0]["exception_class_path"] == "builtins.ValueError"
    done.refresh_from_db()
    assert done.status == TaskResultStatus.SUCCESSFUL
    entry = LogEntry.objects.get(object_id=str(failed.pk))
    assert entry.action_flag == CHANGE and "Retried" in entry.change_message


@pytest.mark.django_db(transaction=True)
def test_retried_task_runs_again(
    superuser_client: Client, run_worker: Callable[..., Worker]
) -> None:
    failed = task_row(TaskResultStatus.FAILED, task_path="tests.tasks.add")
    act(superuser_client, "retry_tasks", failed)
    run_worker()
    failed.refresh_from_db()
    assert failed.status == TaskResultStatus.SUCCESSFUL
    assert failed.return_value == 3
    assert failed.attempts == 2 and len(failed.errors) == 1


def test_cancel_fails_ready_tasks_only(superuser_client: Client) -> None:
    ready = task_row(TaskResultStatus.READY)
    running = task_row(TaskResultStatus.RUNNING)
    body = act(superuser_client, "cancel_tasks", ready, running)
    assert "1 task(s) cancelled" in body
    ready.refresh_from_db()
    assert ready.status == TaskResultStatus.FAILED and ready.finished_at is not None
    assert ready.errors[-1]["exception_class_path"] == CANCELLED
    assert "by admin" in ready.errors[-1]["traceback"]
    running.refresh_from_db()
    assert running.status == TaskResultStatus.RUNNING
    assert ready.task_result.errors[-1].exception_class.__name__ == "TaskCancelled"


def test_cancel_leaves_a_task_claimed_meanwhile(superuser_client: Client) -> None:
    from django_sqltasks.store import control

    ready = task_row(TaskResultStatus.READY)
    stale = TaskRecord.objects.get(pk=ready.pk)
    # A worker claims the task between the admin's read and its update.
    TaskRecord.objects.filter(pk=ready.pk).update(status=TaskResultStatus.RUNNING, attempts=1)
    assert control.cancel([stale], using="default", reason="test") == []
    ready.refresh_from_db()
    assert ready.status == TaskResultStatus.RUNNING and ready.errors == []


def test_delete_selected_deletes_finished_tasks_only(superuser_client: Client) -> None:
    done = task_row(TaskResultStatus.SUCCESSFUL)
    ready = task_row(TaskResultStatus.READY)
    confirm = act(superuser_client, "delete_selected", done, ready)
    assert "Are you sure" in confirm
    act(superuser_client, "delete_selected", done, ready, post="yes")
    assert list(TaskRecord.objects.values_list("pk", flat=True)) == [ready.pk]
    assert LogEntry.objects.get(object_id=str(done.pk)).action_flag == DELETION


def test_actions_need_their_permission() -> None:
    failed = task_row(TaskResultStatus.FAILED)
    viewer = staff_client("view_taskrecord")
    page = viewer.get(reverse(CHANGELIST)).content.decode()
    assert "retry_tasks" not in page and "cancel_tasks" not in page
    assert "delete_selected" not in page
    act(viewer, "retry_tasks", failed)
    failed.refresh_from_db()
    assert failed.status == TaskResultStatus.FAILED
    url = reverse("admin:django_sqltasks_taskrecord_retry", args=[failed.pk])
    assert viewer.post(url).status_code == 403


def test_retry_permission_alone_allows_retry() -> None:
    failed = task_row(TaskResultStatus.FAILED)
    client = staff_client("view_taskrecord", "retry_taskrecord")
    page = client.get(reverse(CHANGELIST)).content.decode()
    assert "retry_tasks" in page and "cancel_tasks" not in page
    act(client, "retry_tasks", failed)
    failed.refresh_from_db()
    assert failed.status == TaskResultStatus.READY


@pytest.mark.parametrize(
    ("status", "button", "after"),
    [
        (TaskResultStatus.FAILED, "retry", TaskResultStatus.READY),
        (TaskResultStatus.READY, "cancel", TaskResultStatus.FAILED),
    ],
)
def test_detail_page_buttons(
    superuser_client: Client, status: str, button: str, after: str
) -> None:
    record = task_row(status)
    change = reverse("admin:django_sqltasks_taskrecord_change", args=[record.pk])
    assert f'id="sqltasks-{button}"' in superuser_client.get(change).content.decode()
    url = reverse(f"admin:django_sqltasks_taskrecord_{button}", args=[record.pk])
    assert superuser_client.get(url).status_code == 405  # POST only
    response = superuser_client.post(url)
    assert response.status_code == 302 and response["Location"] == change
    record.refresh_from_db()
    assert record.status == after


def test_detail_page_has_no_delete_for_unfinished_tasks(superuser_client: Client) -> None:
    ready = task_row(TaskResultStatus.READY)
    change = reverse("admin:django_sqltasks_taskrecord_change", args=[ready.pk])
    body = superuser_client.get(change).content.decode()
    assert "deletelink" not in body and 'id="sqltasks-retry"' not in body
    delete = reverse("admin:django_sqltasks_taskrecord_delete", args=[ready.pk])
    assert superuser_client.post(delete, {"post": "yes"}).status_code == 403
    assert TaskRecord.objects.filter(pk=ready.pk).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("task_path", "said"),
    [
        ("tests.tasks.slow_sync", "1 running sync task(s) cannot be interrupted"),
        ("tests.tasks.slow_async", "1 running async task(s) will be cancelled at their worker"),
    ],
)
def test_cancelling_a_running_task_says_what_happens_to_it(
    superuser_client: Client, task_path: str, said: str
) -> None:
    row = task_row(TaskResultStatus.RUNNING, task_path=task_path, args=[1])
    response = superuser_client.post(
        reverse("admin:django_sqltasks_taskrecord_changelist"),
        {"action": "cancel_tasks", "_selected_action": [row.pk]},
        follow=True,
    )
    text = response.content.decode()
    assert "0 task(s) cancelled" not in text and "skipped" not in text
    assert said in text
    assert TaskRecord.objects.get(pk=row.pk).cancel_requested


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("status", "task_path", "label"),
    [
        (TaskResultStatus.READY, "tests.tasks.slow_sync", "Cancel"),
        (TaskResultStatus.RUNNING, "tests.tasks.slow_async", "Cancel at its next heartbeat"),
        (TaskResultStatus.RUNNING, "tests.tasks.slow_sync", "Cancel if not started yet"),
    ],
)
def test_the_cancel_button_says_what_it_does_to_the_task(
    superuser_client: Client, status: str, task_path: str, label: str
) -> None:
    row = task_row(status, task_path=task_path, args=[1])
    change = reverse("admin:django_sqltasks_taskrecord_change", args=[row.pk])
    body = superuser_client.get(change).content.decode()
    assert re.search(rf'<button type="submit" id="sqltasks-cancel" title="[^"]+">{label}</', body)
    if status == TaskResultStatus.RUNNING:  # asked already: no button that would do nothing
        TaskRecord.objects.filter(pk=row.pk).update(cancel_requested=True)
        assert 'id="sqltasks-cancel"' not in superuser_client.get(change).content.decode()
