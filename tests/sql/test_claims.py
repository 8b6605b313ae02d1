"""The claim (``sql/claims.py`` and each database's form): its plans, the prepared claim of
PostgreSQL, suspects and limit keys; on the active database."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.utils import timezone

from django_sqltasks.models import TaskRecord
from django_sqltasks.sql.dialect import Dialect
from django_sqltasks.sql.rows import (
    SUSPECT_CLEARED,
    SUSPECT_TOGETHER,
    SUSPECT_UNBOUNDED,
    Outcome,
    stored,
    suspect_at,
)
from tests.factories import task_row
from tests.sql.support import WORKER, claim_batch, new_task


def _claim_suspects(dialect: Dialect, queues: list[str] | None) -> list[uuid.UUID]:
    with connection.cursor() as cursor:
        found = dialect.suspects(cursor, backend_name="default", queue_names=queues, limit=8)
        return [
            s.id for s in found if dialect.claim_suspect_by_id(cursor, s.id, WORKER) is not None
        ]


@pytest.mark.django_db(transaction=True)
def test_suspects_are_found_best_first_and_never_taken_by_the_main_claim(
    dialect: Dialect,
) -> None:
    low = task_row(priority=-5, available_at=suspect_at()).id
    high = task_row(priority=7, available_at=suspect_at()).id
    limited = task_row(priority=3, available_at=suspect_at(), limit_key="task:x").id
    unbounded = task_row(priority=0, available_at=stored(SUSPECT_UNBOUNDED)).id
    together = task_row(priority=-2, available_at=stored(SUSPECT_TOGETHER)).id
    other_queue = task_row(queue_name="other", available_at=suspect_at()).id
    # A cleared suspect (running past its bound) is no suspect waiting, even if READY.
    task_row(available_at=stored(SUSPECT_CLEARED))
    due = task_row().id
    assert [r.id for r in claim_batch(dialect)] == [due]
    with connection.cursor() as cursor:
        assert dialect.suspects_waiting(cursor, backend_name="default", queue_names=["default"])
        found = dialect.suspects(cursor, backend_name="default", queue_names=["default"], limit=8)
    assert [s.id for s in found] == [high, limited, unbounded, together, low]
    assert [s.bounded for s in found] == [True, True, False, False, True]
    assert [s.together for s in found] == [False, False, False, True, False]
    assert found[1].limit_key == "task:x" and found[1].queue_name == "default"
    assert _claim_suspects(dialect, ["default"]) == [high, limited, unbounded, together, low]
    with connection.cursor() as cursor:
        assert not dialect.suspects_waiting(cursor, backend_name="default", queue_names=["default"])
    record = TaskRecord.objects.get(id=high)
    # It keeps its mark while it runs: a rescue then knows it ran alone.
    assert (record.status, record.owner, record.attempts) == ("RUNNING", WORKER, 1)
    assert record.available_at == suspect_at()
    assert TaskRecord.objects.get(id=together).available_at == stored(SUSPECT_TOGETHER)
    assert TaskRecord.objects.get(id=other_queue).status == "READY"
    with connection.cursor() as cursor:
        # Taken by another worker meanwhile: no row.
        assert dialect.claim_suspect_by_id(cursor, high, "another") is None
        # Past its time bound, its worker clears it, once; an unbounded one is not cleared.
        assert dialect.clear_suspect(cursor, high, WORKER)
        assert not dialect.clear_suspect(cursor, high, WORKER)
        assert not dialect.clear_suspect(cursor, unbounded, WORKER)
    assert TaskRecord.objects.get(id=high).available_at == stored(SUSPECT_CLEARED)


def _plan(dialect: Dialect, sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        return dialect.explain(cursor, sql, params)


@pytest.mark.django_db
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
    from django_sqltasks.sql.pg import connection_params
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
        dialect.insert(cursor, [new_task() for _ in range(3)])
    connection.ensure_connection()
    raw = connection.connection
    raw.prepare_threshold = 5
    try:
        first = claim_batch(dialect, limit=2)
        second = claim_batch(dialect, limit=2)  # the prepared statement again
        assert claim_batch(dialect, limit=2) == []
    finally:
        raw.prepare_threshold = None
    assert len(first) == 2 and len(second) == 1
    assert {r.id for r in first}.isdisjoint({r.id for r in second})
    assert all(r.worker_ids == [WORKER] and r.attempts == 1 for r in first + second)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's prepared statements")
@pytest.mark.django_db(transaction=True)
def test_a_tasks_enqueue_and_outcome_are_planned_once_where_prepared(dialect: Dialect) -> None:
    # Prepared statements spare the server a plan per call only if the plan cache keeps the
    # generic plan after its first five custom ones: an outcome write whose ids the planner
    # reads as a constant made each custom plan look cheaper, and was planned at every call.
    with connection.cursor() as cursor:  # enough live rows that the ids' index is worth it
        dialect.bulk_insert(cursor, [new_task() for _ in range(2_000)])
        cursor.execute(f"ANALYZE {TaskRecord._meta.db_table}")
    connection.ensure_connection()
    raw = connection.connection
    raw.prepare_threshold = 5  # what OPTIONS {"prepare_threshold": 5} sets
    try:
        for _ in range(8):
            with connection.cursor() as cursor:
                dialect.insert(cursor, [new_task()])
            (row,) = claim_batch(dialect, limit=1)
            outcome = Outcome(
                id=row.id, status="SUCCESSFUL", finished_at=timezone.now(), return_value="1"
            )
            with connection.cursor() as cursor:
                assert dialect.complete(cursor, WORKER, [outcome]) == {row.id}
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            )
            plans = {statement: (generic, custom) for statement, generic, custom in cursor}
    finally:
        raw.prepare_threshold = None
    enqueues = [p for s, p in plans.items() if s.lstrip().startswith("INSERT INTO")]
    outcomes = [p for s, p in plans.items() if "WITH done AS" in s]
    assert len(enqueues) == 1 and len(outcomes) == 1, plans
    for generic, custom in enqueues + outcomes:
        assert custom <= 5 and generic >= 3, plans
    assert TaskRecord.objects.succeeded().count() == 8


@pytest.mark.django_db(transaction=True)
def test_limit_keys_are_found_one_probe_a_key_and_claimed_in_their_scope(
    dialect: Dialect,
) -> None:
    from django_sqltasks.sql import Scope

    tasks = [new_task(limit_key=key) for key in ("b", "a", "a", "c")] + [new_task()]
    with connection.cursor() as cursor:
        dialect.insert(cursor, tasks)
        assert dialect.limit_keys(cursor, "default", after="", count=10) == ["a", "b", "c"]
        assert dialect.limit_keys(cursor, "default", after="a", count=1) == ["b"]
        assert dialect.limit_keys(cursor, "other", after="", count=10) == []
        limited = dialect.claim(
            cursor,
            backend_name="default",
            queue_names=None,
            worker_id=WORKER,
            limit=10,
            scope=Scope(limit_key="a"),
        )
    assert sorted(r.id for r in limited) == sorted(t.id for t in tasks[1:3])
    # The main claim takes only the task of no limit.
    assert [r.id for r in claim_batch(dialect)] == [tasks[4].id]
