"""The claim (``sql/claims.py`` and each database's form): its plans and the prepared claim of
PostgreSQL; on the active database."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.utils import timezone

from django_sqltasks.models import TaskRecord
from django_sqltasks.sql.dialect import Dialect
from django_sqltasks.sql.prepared import worker_thread
from django_sqltasks.sql.rows import (
    Outcome,
)
from tests.sql.support import WORKER, claim_batch, new_task


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
    from django_sqltasks.sql.prepared import _can_prepare

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


def _generic_finish_plan(name_like: str) -> str:
    """The plan the server would keep for the prepared outcome write on this connection."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name FROM pg_prepared_statements WHERE statement LIKE %s", [name_like]
        )
        name = cursor.fetchone()[0]
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        try:
            cursor.execute(f"EXPLAIN EXECUTE {name}('[]'::jsonb, '{{}}'::uuid[], 'w')")
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET plan_cache_mode")


def _finish_prepared(dialect: Dialect) -> str:
    """Claim and finish a task with the statements prepared at once; the generic plan of the
    outcome write, and the session's jit and enable_seqscan."""
    connection.ensure_connection()
    connection.connection.prepare_threshold = 0
    try:
        for row in claim_batch(dialect, limit=1):
            with connection.cursor() as cursor:
                done = timezone.now()
                dialect.complete(cursor, WORKER, [Outcome(row.id, "SUCCESSFUL", done, "null")])
        plan = _generic_finish_plan("%WITH done AS%")
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('enable_seqscan'), current_setting('jit')")
            seqscan, jit = cursor.fetchone()
            return f"{plan}\njit={jit}\nenable_seqscan={seqscan}"
    finally:
        connection.close()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's prepared statements")
@pytest.mark.django_db(transaction=True)
def test_the_workers_prepared_statements_keep_to_the_indexes_planned_on_a_small_table(
    dialect: Dialect,
) -> None:
    """A statement prepared while the live partition holds a row or two is planned for that
    size: the outcome write would scan the whole partition for the life of the connection
    (as the claim's TID lookup would), every dead version a held snapshot keeps in it. On the
    worker's own threads the session turns sequential scans off first; elsewhere (an
    enqueuing web process) its session is left as it is."""
    with connection.cursor() as cursor:
        # Earlier tests on this database may have grown the partition's indexes (a flush
        # empties the heap, not always the index): start from a partition that is small.
        cursor.execute("TRUNCATE django_sqltasks_taskrecord_live")
        dialect.insert(cursor, [new_task() for _ in range(4)])
        cursor.execute("VACUUM ANALYZE django_sqltasks_taskrecord_live")
    connection.close()
    elsewhere = _finish_prepared(dialect)
    assert "Seq Scan on django_sqltasks_taskrecord_live" in elsewhere, elsewhere
    assert elsewhere.endswith("enable_seqscan=on")  # and jit as the server has it
    with ThreadPoolExecutor(1, initializer=worker_thread) as thread:
        plan = thread.submit(_finish_prepared, dialect).result()
    assert "Seq Scan" not in plan and "django_sqltasks_taskrecord_live" in plan, plan
    assert plan.endswith("jit=off\nenable_seqscan=off")
