"""The task list on a large table: bounded queries, estimated counts on PostgreSQL, filters."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_sqltasks.admin import lists as admin_list
from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord
from tests.factories import plan_uses, task_row

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_sqltasks_taskrecord_changelist"
MANY = 1500  # rows: above EXACT_COUNT_BELOW, so PostgreSQL estimates


@pytest.fixture
def client_() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    return client


def bulk_tasks(count: int) -> None:
    TaskRecord.objects.bulk_create(
        TaskRecord(
            task_path=f"tests.tasks.{'add' if i % 3 else 'echo'}",
            backend_name="default",
            queue_name="default" if i % 2 else "other",
            status=TaskResultStatus.SUCCESSFUL if i % 5 else TaskResultStatus.FAILED,
        )
        for i in range(count)
    )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {TaskRecord._meta.db_table}")


def counts(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]


@pytest.mark.parametrize(
    "params",
    [{}, {"status__exact": "FAILED"}, {"queue_name": "other"}, {"task_path": "tests.tasks.add"}],
)
def test_changelist_query_budget(client_: Client, params: dict[str, str]) -> None:
    bulk_tasks(MANY)
    with CaptureQueriesContext(connection) as queries:
        response = client_.get(reverse(CHANGELIST), params)
    assert response.status_code == 200
    # session, user, count (or estimate), page, 3 queue-filter, 1 task-filter lookups
    assert len(queries) <= 10, [q["sql"] for q in queries.captured_queries]
    if connection.vendor == "postgresql":
        # Never an unbounded COUNT(*): one that stops at EXACT_COUNT_BELOW rows, then the
        # planner's estimate for results past that.
        assert len(counts(queries)) == 1 and " LIMIT 1000" in counts(queries)[0]
        if not params:
            assert "about" in response.content.decode()
    else:
        assert len(counts(queries)) == 1


def test_small_results_are_counted_exactly(client_: Client) -> None:
    task_row(TaskResultStatus.FAILED)
    body = client_.get(reverse(CHANGELIST)).content.decode()
    assert "1 task" in body and "about" not in body


def test_filters_offer_configured_queues_and_recent_tasks(client_: Client) -> None:
    task_row(TaskResultStatus.READY, queue_name="default", task_path="tests.tasks.echo")
    task_row(TaskResultStatus.SUCCESSFUL, queue_name="slow", task_path="tests.tasks.add")
    body = client_.get(reverse(CHANGELIST)).content.decode()
    for queue in ("default", "other", "slow"):  # QUEUES in tests.settings
        assert f"?queue_name={queue}" in body
    assert "?task_path=tests.tasks.echo" in body and "?task_path=tests.tasks.add" in body


def test_filter_by_queue_and_task(client_: Client) -> None:
    a = task_row(queue_name="other", task_path="tests.tasks.add")
    b = task_row(queue_name="default", task_path="tests.tasks.add")
    c = task_row(queue_name="other", task_path="tests.tasks.echo")
    body = client_.get(
        reverse(CHANGELIST), {"queue_name": "other", "task_path": "tests.tasks.add"}
    ).content.decode()
    assert str(a.pk) in body and str(b.pk) not in body and str(c.pk) not in body


def test_task_filter_reads_a_bounded_number_of_rows(
    client_: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin_list, "RECENT_TASKS_SCANNED", 1)
    task_row(task_path="tests.tasks.echo")  # the older task: its UUIDv7 id comes first
    task_row()
    body = client_.get(reverse(CHANGELIST)).content.decode()
    assert "?task_path=tests.tasks.add" in body
    assert "?task_path=tests.tasks.echo" not in body


def test_duration_column(client_: Client) -> None:
    task_row(TaskResultStatus.SUCCESSFUL)
    assert "1.0 s" in client_.get(reverse(CHANGELIST)).content.decode()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="planner estimates: PostgreSQL")
def test_planner_estimate_is_close_after_analyze() -> None:
    bulk_tasks(MANY)
    estimate = admin_list.planner_estimate(TaskRecord.objects.all())
    assert MANY * 0.8 <= estimate <= MANY * 1.2


@pytest.mark.skipif(connection.vendor != "postgresql", reason="planner choices: PostgreSQL")
@pytest.mark.parametrize(
    "filters",
    [{"task_path": "tests.tasks.add"}, {"status": TaskResultStatus.SUCCESSFUL}, {}],
    ids=["common task", "common status", "all"],
)
def test_newest_first_pages_read_the_primary_key(filters: dict[str, str]) -> None:
    TaskRecord.objects.bulk_create(
        TaskRecord(
            task_path="tests.tasks.echo" if i % 200 == 0 else "tests.tasks.add",
            backend_name="default",
            queue_name="default",
            status=TaskResultStatus.FAILED if i % 200 == 0 else TaskResultStatus.SUCCESSFUL,
        )
        for i in range(5000)
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {TaskRecord._meta.db_table}")
    # The admin's default order: a page of 51 rows reads the newest ids, with no sort. (A rare
    # value is found by a scan instead, as docs/admin.md says.)
    plan = TaskRecord.objects.filter(**filters).order_by("-id")[:51].explain()
    assert "Index Scan Backward using" in plan, plan
    assert plan_uses(plan, "django_sqltasks_taskrecord_pkey"), plan
    # No sort node (PostgreSQL's partitioned table merges its leaves' orders: "Sort Key").
    assert not re.search(r"(^|->  )Sort ", plan), plan
