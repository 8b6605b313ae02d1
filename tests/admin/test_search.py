"""The admin's search: a task by id, a value of its arguments, its subject, its error class or
a tag; through an index on PostgreSQL, over the newest tasks elsewhere; hostile terms answered."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_sqltasks.admin import lists as admin_list
from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord
from django_sqltasks.ops import search
from tests.factories import plan_uses, task_row

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_sqltasks_taskrecord_changelist"
POSTGRESQL = connection.vendor == "postgresql"


@pytest.fixture
def rows() -> dict[str, TaskRecord]:
    failed = task_row(TaskResultStatus.FAILED, args=["other@example.com"])
    failed.errors = [
        {"exception_class_path": "shop.errors.PaymentDeclined", "traceback": "Traceback: no"}
    ]
    failed.save()
    return {
        "email": task_row(args=["alice@example.com", {"deep": ["needle-7"]}]),
        "order": task_row(TaskResultStatus.SUCCESSFUL, kwargs={"order": "ORD-42", "n": 9001}),
        "subject": task_row(subject_type="auth.user", subject_id="17"),
        "tag": task_row(tags=["tenant:acme"]),
        "failed": failed,
        "builtin": task_row(TaskResultStatus.FAILED),  # builtins.ValueError (factories)
    }


def found(term: str) -> set[str]:
    return {
        str(pk)
        for pk in search.search(TaskRecord.objects.all(), term).tasks.values_list("pk", flat=True)
    }


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("alice@example.com", "email"),
        ("needle-7", "email"),
        ("ORD-42", "order"),
        ("auth.user:17", "subject"),
        ("tenant:acme", "tag"),
        ("shop.errors.PaymentDeclined", "failed"),
        ("ValueError", "builtin"),
        ("PaymentDeclined", "failed"),
    ],
)
def test_a_search_finds_a_task_by_each_of_its_keys(
    rows: dict[str, TaskRecord], term: str, expected: str
) -> None:
    assert found(term) == {str(rows[expected].pk)}


def test_a_number_is_found_stored_as_a_number(rows: dict[str, TaskRecord]) -> None:
    assert str(rows["order"].pk) in found("9001")


def test_an_exact_id_reads_the_primary_key(rows: dict[str, TaskRecord]) -> None:
    task = rows["order"]
    tasks = search.search(TaskRecord.objects.all(), f"  {task.pk}  ").tasks
    assert list(tasks) == [task]
    sql = str(tasks.query).upper()
    assert "UPPER" not in sql and "::TEXT" not in sql


@pytest.mark.skipif(not POSTGRESQL, reason="JSON indexes: PostgreSQL")
@pytest.mark.parametrize(
    ("term", "index"),
    [
        ("alice@example.com", "sqltasks_argument_values_idx"),
        ("tenant:acme", "sqltasks_tags_idx"),
        ("shop.errors.PaymentDeclined", "sqltasks_error_class_idx"),
        ("auth.user:17", "sqltasks_subject_idx"),
    ],
)
def test_searches_use_their_indexes(rows: dict[str, TaskRecord], term: str, index: str) -> None:
    # Enough other failed tasks that reading every failed task is not the cheaper plan.
    for _ in range(300):
        task_row(TaskResultStatus.FAILED)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {TaskRecord._meta.db_table}")
        cursor.execute("SET LOCAL enable_seqscan = off")  # a tiny table: ask what it would use
    # The list's bounded count reads the matches in no order (admin/lists.py): through the
    # index. (Newest first, with a LIMIT, a tiny table may as well be read along its primary key.)
    found = search.search(TaskRecord.objects.all(), term).tasks
    plan = found.order_by().values_list("pk", flat=True)[:1000].explain()
    assert plan_uses(plan, index), plan


@pytest.mark.skipif(not POSTGRESQL, reason="JSON indexes: PostgreSQL")
def test_a_row_is_tested_by_its_cheapest_branch_first() -> None:
    # Where a window of ids re-checks the rows the indexes found, PostgreSQL tests the OR's
    # branches in order and stops at the first that holds: a day of FAILED tasks of one class
    # took 97 ms at 50M tasks with the argument values first, 34 ms with them last.
    found = search.search(TaskRecord.objects.all(), "shop.errors.PaymentDeclined").tasks
    where = str(found.query).split(" WHERE ", 1)[1]
    class_path, tags = where.index("exception_class_path"), where.index('"tags" @>')
    assert class_path < tags < where.index("jsonb_path_query_array"), where


@pytest.mark.skipif(not POSTGRESQL, reason="JSON indexes: PostgreSQL")
def test_a_search_page_is_sorted_after_its_matches_are_found(
    rows: dict[str, TaskRecord],
) -> None:
    # Never newest first along the primary key, testing each row against the search: a
    # plan the planner may take when it guesses many matches (782 ms at 50M tasks).
    found = search.search(TaskRecord.objects.all(), "tenant:acme").tasks
    with CaptureQueriesContext(connection) as queries:
        page = admin_list.newest(found.order_by("-pk"), 0, 100)
    assert [task.pk for task in page] == [rows["tag"].pk]
    assert all("DESC NULLS LAST" in q["sql"] for q in queries.captured_queries)
    plan = admin_list.sorted_after_found(found)[:100].explain()
    assert "Index Scan Backward" not in plan, plan
    listed = TaskRecord.objects.filter(status=TaskResultStatus.FAILED).order_by("-pk")
    assert admin_list.sorted_after_found(listed) is listed  # a filter reads the key in order


@pytest.mark.skipif(POSTGRESQL, reason="the bounded search: MariaDB and SQLite")
def test_without_a_json_index_only_the_newest_tasks_are_searched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = task_row(args=["old@example.com"])
    new = task_row(args=["new@example.com"])
    task_row()
    monkeypatch.setattr(search, "SEARCH_WINDOW", 2)
    assert found("new@example.com") == {str(new.pk)}
    assert found("old@example.com") == set()  # past the window: documented in docs/admin.md
    assert found(str(old.pk)) == {str(old.pk)}  # the id is looked up whatever its age
    result = search.search(TaskRecord.objects.all(), "new@example.com")
    assert result.windowed


@pytest.mark.parametrize(
    "term", ["%_\\", "x" * 10240, "\ud800", "a\udfffb", "'; DROP TABLE x; --", "auth.user:%"]
)
def test_hostile_terms_are_answered(rows: dict[str, TaskRecord], term: str) -> None:
    assert found(term) == set()


@pytest.mark.parametrize(
    ("query", "status"),
    [("q=%25_%5C", 200), ("q=" + "y" * 10240, 200), ("q=%ED%A0%80", 200), ("q=a%00b", 400)],
    ids=["wildcards", "10 KB", "lone surrogate", "NUL"],
)
def test_hostile_searches_in_the_admin_are_answered(
    rows: dict[str, TaskRecord], query: str, status: int
) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    response = client.get(f"{reverse(CHANGELIST)}?{query}")
    assert response.status_code == status
    if status == 200:
        assert '<span class="sqltasks-count">0</span>' in response.content.decode()


def test_search_indexes_exist_on_postgresql_only_and_keep_one_built_beforehand() -> None:
    indexes = [
        i
        for i in TaskRecord._meta.indexes
        if i.name.startswith("sqltasks_") and hasattr(i, "expression")
    ]
    assert {i.name for i in indexes} == {
        "sqltasks_argument_values_idx",
        "sqltasks_error_class_idx",
        "sqltasks_tags_idx",
        # Not the search's, PostgreSQL's too: a worker's look for cancel requests.
        "sqltasks_cancel_requested_idx",
    }
    editor = connection.schema_editor(collect_sql=True)  # not entered: SQLite's refuses in a test
    statements = [str(index.create_sql(TaskRecord, editor)) for index in indexes]
    if POSTGRESQL:
        assert all(s.startswith("CREATE INDEX IF NOT EXISTS") for s in statements), statements
        with connection.cursor() as cursor:
            cursor.execute(statements[0])  # built already by the migration: kept, no error
    else:
        assert statements == ["SELECT 1"] * 4  # no index finds a value in JSON here
