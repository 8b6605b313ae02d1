"""The admin under hostile or careless input: bad ids, NUL filters, and live workers' rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import WorkerRecord
from tests.factories import superuser_client, task_row

pytestmark = pytest.mark.django_db


@pytest.fixture
def client_() -> Client:
    return superuser_client()


@pytest.mark.parametrize("button", ["retry", "cancel"])
@pytest.mark.parametrize("object_id", ["not-a-uuid", "1", "x" * 300, "%00"])
def test_a_button_posted_for_no_task_id_is_a_404(
    client_: Client, button: str, object_id: str
) -> None:
    task_row(TaskResultStatus.FAILED)
    url = f"/admin/django_sqltasks/taskrecord/{object_id}/{button}/"
    assert client_.post(url).status_code == 404


@pytest.mark.parametrize(
    ("path", "parameter"),
    [
        ("taskrecord", "queue_name"),
        ("taskrecord", "task_path"),
        ("taskrecord", "backend_name"),
        ("taskrecord", "status__exact"),
        ("taskrecord", "q"),
        ("workerrecord", "q"),
        ("scheduledrecord", "backend_name"),
    ],
)
def test_a_nul_in_a_list_parameter_is_a_400_naming_it(
    client_: Client, path: str, parameter: str
) -> None:
    task_row()
    path = path.replace("scheduledrecord", "schedulerecord")
    response = client_.get(f"/admin/django_sqltasks/{path}/", {parameter: "a\x00b"})
    assert response.status_code == 400
    assert f"The parameter '{parameter}' holds a NUL character" in response.content.decode()


def test_a_nul_in_a_worker_id_is_no_such_worker(client_: Client) -> None:
    response = client_.get("/admin/django_sqltasks/workerrecord/w%001/change/", follow=True)
    assert response.status_code == 200
    assert "doesn\u2019t exist" in response.content.decode()


# Live workers' rows ----------------------------------------------------------------------------


def worker(worker_id: str, heartbeat_ago: timedelta) -> WorkerRecord:
    return WorkerRecord.objects.create(
        id=worker_id, backend_name="default", heartbeat_at=timezone.now() - heartbeat_ago
    )


def test_a_live_worker_s_row_cannot_be_deleted(client_: Client) -> None:
    live = worker("live-1", timedelta(seconds=2))
    url = reverse("admin:django_sqltasks_workerrecord_delete", args=[live.pk])
    response = client_.post(url, {"post": "yes"}, follow=True)
    assert WorkerRecord.objects.filter(pk=live.pk).exists()
    body = response.content.decode()
    assert "Worker live-1 is live" in body and "Stop the worker (SIGTERM) instead" in body
    change = client_.get(reverse("admin:django_sqltasks_workerrecord_change", args=[live.pk]))
    assert 'class="deletelink"' not in change.content.decode()


def test_a_stopped_worker_s_row_can_be_deleted(client_: Client) -> None:
    dead = worker("dead-1", timedelta(minutes=5))  # beyond the 30 s lease
    url = reverse("admin:django_sqltasks_workerrecord_delete", args=[dead.pk])
    client_.post(url, {"post": "yes"})
    assert not WorkerRecord.objects.filter(pk=dead.pk).exists()


def test_the_delete_action_skips_live_workers_and_says_why(client_: Client) -> None:
    live, dead = worker("live-1", timedelta(0)), worker("dead-1", timedelta(hours=1))
    url = reverse("admin:django_sqltasks_workerrecord_changelist")
    selected = {"action": "delete_selected", "_selected_action": [live.pk, dead.pk]}
    confirm = client_.post(url, selected).content.decode()
    assert "Worker live-1 is live" in confirm or "dead-1" in confirm
    response = client_.post(url, {**selected, "post": "yes"}, follow=True)
    assert list(WorkerRecord.objects.values_list("pk", flat=True)) == ["live-1"]
    assert "Worker live-1 is live" in response.content.decode()
