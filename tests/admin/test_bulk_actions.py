"""Actions on every task matching the list's filters: confirmed with the count of the tasks they
change, then run by a job of their own on a worker, in batches, never more than stated."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection, connections
from django.test import Client
from django.urls import reverse

from django_sqltasks.admin import bulk_actions, bulk_jobs
from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import StepRecord, TaskRecord
from tests.admin.test_durable import assert_crumbs
from tests.conftest import WorkerProcess, expire_lease, wait_for
from tests.factories import task_row

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_sqltasks_taskrecord_changelist"
JOB_PATH = f"{bulk_jobs.__name__}.{bulk_jobs.JOB_NAME}"


def post_across(client: Client, query: str, action: str, **confirmed: str) -> str:
    data = {"action": action, "index": "0", "select_across": "1", "_selected_action": "all"}
    data.update(confirmed)
    response = client.post(f"{reverse(CHANGELIST)}?{query}", data, follow=True)
    assert response.status_code == 200
    return response.content.decode()


def confirm(client: Client, query: str, action: str) -> tuple[str, dict[str, str]]:
    """The confirmation page, and the fields its "Yes, I'm sure" posts."""
    page = post_across(client, query, action)
    fields = dict(re.findall(r'name="(sqltasks_\w+)" value="([^"]*)"', page))
    return page, fields


def the_job() -> TaskRecord:
    return TaskRecord.objects.get(task_path=JOB_PATH)


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk_jobs, "BATCH_SIZE", 3)


@pytest.mark.django_db(transaction=True)
def test_the_page_counts_what_changes_and_the_job_changes_exactly_that(
    admin_client: Client, run_worker: Callable[..., Any]
) -> None:
    failed = [task_row(TaskResultStatus.FAILED, queue_name="other") for _ in range(7)]
    kept = task_row(TaskResultStatus.FAILED, queue_name="elsewhere")
    task_row(TaskResultStatus.SUCCESSFUL, queue_name="other")  # matches, but is not retried
    page, fields = confirm(admin_client, "queue_name=other", "retry_tasks")
    assert "these will be retried: 7 task(s)." in page
    assert_crumbs(page, "Every task of the list")  # not "Retried", before anything is
    assert fields["sqltasks_stated"] == "7"
    done = post_across(admin_client, "queue_name=other", "retry_tasks", **fields)
    assert "Queued: 7 task(s) to be retried by a job on a worker, in batches of 3" in done
    job = the_job()
    assert f"/{job.pk}/change/" in done  # the message links to the job's page
    assert TaskRecord.objects.filter(status=TaskResultStatus.READY).count() == 1  # the job
    assert LogEntry.objects.filter(object_repr="retried: 7 task(s) queued").count() == 1
    run_worker(queue_names=["default"])
    job.refresh_from_db()
    assert job.status == TaskResultStatus.SUCCESSFUL
    assert job.return_value["changed"] == 7 and job.return_value["batches"] == 3
    assert job.progress["progress"] == 1.0 and "7 of 7 retried" in job.progress["note"]
    retried = TaskRecord.objects.filter(status=TaskResultStatus.READY).exclude(pk=job.pk)
    assert {r.pk for r in retried} == {r.pk for r in failed}
    assert TaskRecord.objects.get(pk=kept.pk).status == TaskResultStatus.FAILED
    assert LogEntry.objects.filter(object_repr="retried: 7 task(s)").count() == 1
    job_page = admin_client.get(reverse("admin:django_sqltasks_taskrecord_change", args=[job.pk]))
    assert "7 of 7 retried" in job_page.text


@pytest.mark.django_db(transaction=True)
def test_the_job_changes_no_more_than_the_page_stated(
    admin_client: Client, run_worker: Callable[..., Any]
) -> None:
    [task_row(TaskResultStatus.FAILED, queue_name="other") for _ in range(4)]
    running = task_row(TaskResultStatus.RUNNING, queue_name="other")  # not counted: not failed
    _, fields = confirm(admin_client, "", "retry_tasks")
    assert fields["sqltasks_stated"] == "4"
    # Between the page and the click, one more fails, and a new task fails too.
    TaskRecord.objects.filter(pk=running.pk).update(status=TaskResultStatus.FAILED)
    newer = task_row(TaskResultStatus.FAILED, queue_name="other")
    post_across(admin_client, "", "retry_tasks", **fields)
    run_worker(queue_names=["default"])
    assert the_job().return_value["changed"] == 4
    assert TaskRecord.objects.filter(status=TaskResultStatus.READY, queue_name="other").count() == 4
    assert the_job().status == TaskResultStatus.SUCCESSFUL
    assert TaskRecord.objects.get(pk=newer.pk).status == TaskResultStatus.FAILED  # left out


@pytest.mark.django_db(transaction=True)
def test_more_than_it_counts_is_said_so_and_the_job_counts_them(
    admin_client: Client, run_worker: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk_actions, "EXACT_UP_TO", 5)
    [task_row(TaskResultStatus.SUCCESSFUL, args=["acme@example.com"]) for _ in range(8)]
    task_row(TaskResultStatus.SUCCESSFUL, args=["other@example.com"])
    page, fields = confirm(admin_client, "q=acme@example.com", "delete_selected")
    assert "these will be deleted: more than 5 task(s)." in page
    assert fields["sqltasks_stated"] == ""
    done = post_across(admin_client, "q=acme@example.com", "delete_selected", **fields)
    assert "Queued: more than 5 task(s) to be deleted by a job" in done
    run_worker(queue_names=["default"])
    job = the_job()
    assert job.return_value["changed"] == 8 and job.return_value["stated"] is None
    assert "8 of 8 deleted" in job.progress["note"]
    left = TaskRecord.objects.exclude(pk=job.pk).values_list("args", flat=True)
    assert list(left) == [["other@example.com"]]


@pytest.mark.django_db(transaction=True)
def test_cancel_every_match_of_a_search(
    admin_client: Client, run_worker: Callable[..., Any]
) -> None:
    ready = [task_row(args=["acme@example.com"], queue_name="other") for _ in range(4)]
    task_row(args=["other@example.com"], queue_name="other")
    page, fields = confirm(admin_client, "q=acme@example.com", "cancel_tasks")
    assert "cancelled (or asked to stop): 4 task(s)." in page
    post_across(admin_client, "q=acme@example.com", "cancel_tasks", **fields)
    run_worker(queue_names=["default"])
    cancelled = TaskRecord.objects.filter(status=TaskResultStatus.FAILED)
    assert {r.pk for r in cancelled} == {r.pk for r in ready}
    assert "Cancelled in the admin by admin" in cancelled[0].errors[-1]["traceback"]


def test_a_second_job_is_refused_while_one_is_live(admin_client: Client) -> None:
    [task_row(TaskResultStatus.FAILED) for _ in range(2)]
    _, fields = confirm(admin_client, "", "retry_tasks")
    post_across(admin_client, "", "retry_tasks", **fields)
    job = the_job()
    _, fields = confirm(admin_client, "", "delete_selected")
    refused = post_across(admin_client, "", "delete_selected", **fields)
    assert "Nothing was deleted: another action on every task of a list is under way" in refused
    assert f"/{job.pk}/change/" in refused
    assert TaskRecord.objects.filter(task_path=JOB_PATH).count() == 1


def test_nothing_to_change_offers_no_confirmation(admin_client: Client) -> None:
    task_row(TaskResultStatus.READY)
    page, fields = confirm(admin_client, "", "retry_tasks")
    assert "No task matching the list's filters and search can be retried." in page
    assert "sqltasks_stated" not in fields and 'id="sqltasks-bulk-confirm"' not in page


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"sqltasks_below": "x"}, "Field sqltasks_stated: missing"),
        (
            {"sqltasks_stated": "many", "sqltasks_below": "x"},
            "Field sqltasks_stated: must be a whole",
        ),
        (
            {"sqltasks_stated": "3", "sqltasks_below": "x"},
            "Field sqltasks_below: must be a task id",
        ),
    ],
)
def test_a_tampered_confirmation_is_refused_naming_the_field(
    admin_client: Client, fields: dict[str, str], error: str
) -> None:
    task_row(TaskResultStatus.FAILED)
    page = post_across(admin_client, "", "retry_tasks", sqltasks_confirmed="yes", **fields)
    assert error in page
    assert not TaskRecord.objects.filter(task_path=JOB_PATH).exists()


def test_the_job_is_not_run_inside_the_request(admin_client: Client) -> None:
    [task_row(TaskResultStatus.FAILED) for _ in range(2)]
    _, fields = confirm(admin_client, "", "retry_tasks")
    post_across(admin_client, "", "retry_tasks", **fields)
    assert the_job().status == TaskResultStatus.READY
    assert not StepRecord.objects.exists()
    assert TaskRecord.objects.filter(status=TaskResultStatus.FAILED).count() == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker_process_core
@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite locks the whole database: no row lock can hold the second batch alone",
)
def test_a_job_whose_worker_is_killed_runs_on_from_its_last_batch(
    admin_client: Client,
    worker_process: Callable[..., WorkerProcess],
    run_worker: Callable[..., Any],
) -> None:
    failed = [task_row(TaskResultStatus.FAILED, queue_name="other") for _ in range(9)]
    newest_first = sorted((row.pk for row in failed), reverse=True)
    _, fields = confirm(admin_client, "queue_name=other", "retry_tasks")
    post_across(admin_client, "queue_name=other", "retry_tasks", **fields)
    job = the_job()
    # Hold the second batch's first row: the victim commits its first batch, then waits.
    holder = connections.create_connection("default")
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            table = holder.ops.quote_name(TaskRecord._meta.db_table)
            cursor.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [newest_first[3]])
        victim = worker_process("--queue", "default", "--worker-id", "victim")
        first = StepRecord.objects.filter(task_id=job.pk, name="batch", occurrence=0)
        wait_for(first.exists)  # the first batch and its record committed together
        victim.kill()
        assert victim.wait() == -signal.SIGKILL
    finally:
        holder.rollback()
        holder.close()
    assert TaskRecord.objects.filter(pk__in=newest_first[:3], status="READY").count() == 3
    assert TaskRecord.objects.filter(pk__in=newest_first[3:], status="FAILED").count() == 6
    expire_lease("victim")
    run_worker(queue_names=["default"])  # rescues the job, which runs on from its steps
    job.refresh_from_db()
    assert job.status == TaskResultStatus.SUCCESSFUL, job.errors
    assert job.rescues == 1  # it ran alone on the worker that died
    assert job.return_value["changed"] == 9 and job.return_value["batches"] == 3
    # No batch ran twice: each step record was written by one run.
    batches = StepRecord.objects.filter(task_id=job.pk, name="batch").order_by("occurrence")
    assert list(batches.values_list("occurrence", "attempts")) == [(0, 1), (1, 1), (2, 1)]
    assert TaskRecord.objects.filter(queue_name="other", status="READY").count() == 9
    assert LogEntry.objects.filter(object_repr="retried: 9 task(s)").count() == 1


def test_a_job_for_a_list_no_admin_site_shows_fails_saying_so(admin_user: Any) -> None:
    with pytest.raises(bulk_jobs.JobUnavailable, match="No admin site named 'gone' lists"):
        bulk_jobs.listed("gone", "", admin_user.pk)
    assert bulk_jobs.listed("admin", "queue_name=other", admin_user.pk).query.where
