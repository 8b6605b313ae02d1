"""The SQL conformance suite: every operation of ``sql/`` on the active database (the same
file runs on SQLite, PostgreSQL and MariaDB), with the plans of the claim, rescue and prune."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord
from django_sqltasks.sql import NewTask, Outcome, dialect_for, unsupported_version
from django_sqltasks.sql.base import Dialect
from tests.factories import task_row

WORKER = "dialect-worker"


@pytest.fixture
def dialect() -> Dialect:
    return dialect_for(connection)


def _new(dedupe_key: str | None = None, **fields: object) -> NewTask:
    now = timezone.now()
    values: dict[str, object] = {
        "id": uuid.uuid4(),
        "task_path": "tests.tasks.add",
        "backend_name": "default",
        "queue_name": "default",
        "priority": 0,
        "args": [1, 2],
        "kwargs": {},
        "enqueued_at": now,
        "run_after": None,
        "dedupe_key": dedupe_key,
    }
    values.update(fields)
    return NewTask(**values)


def _claim(dialect: Dialect, limit: int = 10, queues: list[str] | None = None) -> list:
    with connection.cursor() as cursor:
        return dialect.claim(
            cursor,
            backend_name="default",
            queue_names=queues,
            worker_id=WORKER,
            limit=limit,
        )


@pytest.mark.django_db(transaction=True)
def test_facts(dialect: Dialect) -> None:
    assert dialect.wakeup in {"notify", "files", "poll"}
    assert dialect.single_writer is (connection.vendor == "sqlite")
    assert unsupported_version("default") is None
    assert dialect.version_problem() is None
    assert dialect.too_old((1, 0), (2, 0)).endswith("needs " + dialect.product + " 2.0 or newer.")


@pytest.mark.django_db(transaction=True)
def test_insert_then_claim_returns_rows_in_full(dialect: Dialect) -> None:
    tasks = [_new(), _new(priority=5), _new(queue_name="other")]
    with connection.cursor() as cursor:
        dialect.insert(cursor, tasks[:2])
        dialect.bulk_insert(cursor, tasks[2:])
    claimed = {row.id: row for row in _claim(dialect, queues=["default"])}
    assert set(claimed) == {tasks[0].id, tasks[1].id}
    row = claimed[tasks[1].id]
    assert (row.task_path, row.priority, row.args, row.kwargs) == ("tests.tasks.add", 5, [1, 2], {})
    assert row.attempts == 1 and row.worker_ids == [WORKER] and row.corrupt is None
    assert TaskRecord.objects.get(id=tasks[0].id).owner == WORKER
    assert [r.id for r in _claim(dialect)] == [tasks[2].id]  # every queue
    assert _claim(dialect) == []


@pytest.mark.django_db(transaction=True)
def test_deduplicated_insert_and_the_live_key(dialect: Dialect) -> None:
    first, second = _new("key-1"), _new("key-1")
    with connection.cursor() as cursor:
        assert dialect.insert_deduplicated(cursor, first, notify=False)
        assert not dialect.insert_deduplicated(cursor, second, notify=False)
        assert dialect.live_task_with_key(cursor, "key-1") == first.id
        assert dialect.live_task_with_key(cursor, "key-2") is None


@pytest.mark.django_db(transaction=True)
def test_complete_writes_only_tasks_still_held(dialect: Dialect) -> None:
    mine = task_row(TaskResultStatus.RUNNING, owner=WORKER).id
    retried = task_row(TaskResultStatus.RUNNING, owner=WORKER).id
    theirs = task_row(TaskResultStatus.RUNNING, owner="someone-else").id
    now = timezone.now()
    outcomes = [
        Outcome(id=mine, status="SUCCESSFUL", finished_at=now, return_value='{"a": 1}'),
        Outcome(
            id=retried,
            status="READY",
            finished_at=None,
            return_value=None,
            error_class="builtins.ValueError",
            error_traceback="Traceback: x",
            available_at=now + timedelta(minutes=1),
        ),
        Outcome(id=theirs, status="SUCCESSFUL", finished_at=now, return_value="1"),
    ]
    with connection.cursor() as cursor:
        assert dialect.complete(cursor, WORKER, outcomes) == {mine, retried}
    assert TaskRecord.objects.get(id=mine).return_value == {"a": 1}
    again = TaskRecord.objects.get(id=retried)
    assert again.status == "READY" and again.errors[-1]["traceback"] == "Traceback: x"
    assert TaskRecord.objects.get(id=theirs).owner == "someone-else"


@pytest.mark.django_db(transaction=True)
def test_salvage_replaces_the_outcome_with_an_error_saying_why(dialect: Dialect) -> None:
    held = task_row(TaskResultStatus.RUNNING, owner=WORKER).id
    outcome = Outcome(id=held, status="SUCCESSFUL", finished_at=timezone.now(), return_value="1")
    with connection.cursor() as cursor:
        assert dialect.salvage(cursor, WORKER, outcome, "too big \x00 \ud800") == {held}
        assert dialect.salvage(cursor, WORKER, outcome, "again") == set()
    record = TaskRecord.objects.get(id=held)
    assert record.status == "FAILED" and record.owner is None
    assert record.errors == [
        {
            "exception_class_path": "django_sqltasks.exceptions.OutcomeNotStored",
            "traceback": "too big \\x00 \\ud800",
        }
    ]


@pytest.mark.django_db(transaction=True)
def test_requeue_owned_keeps_what_it_is_told(dialect: Dialect) -> None:
    kept = task_row(TaskResultStatus.RUNNING, owner=WORKER).id
    released = task_row(TaskResultStatus.RUNNING, owner=WORKER).id
    with connection.cursor() as cursor:
        count = dialect.requeue_owned(cursor, worker_id=WORKER, reason="stopping", keep=[kept])
    assert count == 1
    assert TaskRecord.objects.get(id=kept).status == "RUNNING"
    record = TaskRecord.objects.get(id=released)
    assert record.status == "READY" and record.errors[-1]["traceback"] == "stopping"


@pytest.mark.django_db(transaction=True)
def test_requeue_orphans_rescues_then_gives_up(dialect: Dialect) -> None:
    lost = task_row(TaskResultStatus.RUNNING, owner="gone").id
    spent = task_row(TaskResultStatus.RUNNING, owner="gone", rescues=2).id
    with connection.cursor() as cursor:
        count = dialect.requeue_orphans(
            cursor, backend_name="default", lease_timeout=30, max_rescues=2
        )
    assert count == 2
    assert TaskRecord.objects.get(id=lost).status == "READY"
    assert TaskRecord.objects.get(id=lost).rescues == 1
    assert TaskRecord.objects.get(id=spent).status == "FAILED"


@pytest.mark.django_db(transaction=True)
def test_ping_result_select_and_error_kinds(dialect: Dialect) -> None:
    row = task_row()
    with connection.cursor() as cursor:
        dialect.ping(cursor)
        cursor.execute(
            dialect.select_result_sql(["id", "status"]), [dialect.encode_id(row.id), "default"]
        )
        assert cursor.fetchone()[1] == "READY"
        with pytest.raises(DatabaseError) as refused:
            cursor.execute("SELECT no_such_column FROM django_sqltasks_nothing")
    assert not dialect.is_transient(refused.value)
    assert not dialect.is_contention(refused.value)


def _plan(dialect: Dialect, sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        return dialect.explain(cursor, sql, params)


@pytest.mark.django_db(transaction=True)
def test_the_claim_rescue_and_prune_statements_have_plans(dialect: Dialect) -> None:
    now = timezone.now()
    claim = _plan(
        dialect,
        *dialect.claim_sql(
            backend_name="default", queue_names=["default"], worker_id=WORKER, limit=10
        ),
    )
    assert "sqltasks" in claim.lower()
    rescue = _plan(
        dialect,
        *dialect.requeue_orphans_sql(backend_name="default", lease_timeout=30, max_rescues=5),
    )
    assert rescue
    old = TaskRecord.objects.succeeded().filter(finished_at__lte=now).values_list("pk", flat=True)
    assert old[:1000].explain()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's prepared claim")
def test_the_claim_is_prepared_only_where_the_project_allows_prepared_statements() -> None:
    psycopg = pytest.importorskip("psycopg")
    from django_sqltasks.pg import connection_params
    from django_sqltasks.sql.postgresql import _can_prepare

    with psycopg.connect(**connection_params("default")) as raw:
        # Django's default: OPTIONS "prepare_threshold" None, for poolers' sake.
        assert raw.prepare_threshold is None and not _can_prepare(raw)
        raw.prepare_threshold = 5  # what OPTIONS {"prepare_threshold": 5} sets
        assert _can_prepare(raw)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's prepared claim")
@pytest.mark.django_db(transaction=True)
def test_a_prepared_claim_takes_the_same_rows(dialect: Dialect) -> None:
    with connection.cursor() as cursor:
        dialect.insert(cursor, [_new() for _ in range(3)])
    connection.ensure_connection()
    raw = connection.connection
    raw.prepare_threshold = 5
    try:
        first = _claim(dialect, limit=2)
        second = _claim(dialect, limit=2)  # the prepared statement again
        assert _claim(dialect, limit=2) == []
    finally:
        raw.prepare_threshold = None
    assert len(first) == 2 and len(second) == 1
    assert {r.id for r in first}.isdisjoint({r.id for r in second})
    assert all(r.worker_ids == [WORKER] and r.attempts == 1 for r in first + second)
