"""Actions on every task matching the list's filters: confirmed with the count, run in batches."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord
from django_sqltasks.store import batches
from tests.factories import task_row

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_sqltasks_taskrecord_changelist"


def post_across(client: Client, query: str, action: str, confirmed: bool) -> str:
    data = {"action": action, "index": "0", "select_across": "1", "_selected_action": "all"}
    if confirmed:
        data["sqltasks_confirmed"] = "yes"
    response = client.post(f"{reverse(CHANGELIST)}?{query}", data, follow=True)
    assert response.status_code == 200
    return response.content.decode()


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batches, "BATCH_SIZE", 3)
    monkeypatch.setattr(batches.in_batches, "__defaults__", (3,))


def test_retry_every_failed_task_of_a_filter_after_confirming(admin_client: Client) -> None:
    failed = [task_row(TaskResultStatus.FAILED, queue_name="other") for _ in range(7)]
    kept = task_row(TaskResultStatus.FAILED, queue_name="default")
    task_row(TaskResultStatus.SUCCESSFUL, queue_name="other")
    page = post_across(admin_client, "queue_name=other", "retry_tasks", confirmed=False)
    assert 'id="sqltasks-bulk-count"' in page and "8 task(s)" in page  # 7 failed, 1 successful
    assert TaskRecord.objects.filter(status=TaskResultStatus.READY).count() == 0  # not yet
    done = post_across(admin_client, "queue_name=other", "retry_tasks", confirmed=True)
    assert "7 task(s) retried of every task matching the list (3 batch(es))" in done
    retried = TaskRecord.objects.filter(status=TaskResultStatus.READY)
    assert {r.pk for r in retried} == {r.pk for r in failed}
    assert TaskRecord.objects.get(pk=kept.pk).status == TaskResultStatus.FAILED
    assert LogEntry.objects.filter(object_repr="retried: 7 task(s)").count() == 1


def test_cancel_and_delete_every_match_of_a_search(admin_client: Client) -> None:
    ready = [task_row(args=["acme@example.com"]) for _ in range(4)]
    task_row(args=["other@example.com"])
    done = post_across(admin_client, "q=acme@example.com", "cancel_tasks", confirmed=True)
    assert "4 task(s) cancelled (or asked to stop)" in done
    assert {r.pk for r in TaskRecord.objects.filter(status=TaskResultStatus.FAILED)} == {
        r.pk for r in ready
    }
    deleted = post_across(admin_client, "q=acme@example.com", "delete_selected", confirmed=True)
    assert "4 task(s) deleted" in deleted
    assert list(TaskRecord.objects.values_list("args", flat=True)) == [["other@example.com"]]
