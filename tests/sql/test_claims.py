"""The claim (``sql/claims.py`` and each database's form): its plans, the prepared claim of
PostgreSQL, suspects and limit keys; on the active database."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_sqltasks.models import PausedQueue, TaskRecord
from django_sqltasks.sql import UNLIMITED
from django_sqltasks.sql.dialect import Dialect
from django_sqltasks.sql.postgresql import ANNOUNCED_SEP, CHANNEL, read_announcement
from django_sqltasks.sql.rows import (
    SUSPECT_CLEARED,
    SUSPECT_UNBOUNDED,
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
    other_queue = task_row(queue_name="other", available_at=suspect_at()).id
    # A cleared suspect (running past its bound) is no suspect waiting, even if READY.
    task_row(available_at=stored(SUSPECT_CLEARED))
    due = task_row().id
    assert [r.id for r in claim_batch(dialect)] == [due]
    with connection.cursor() as cursor:
        assert dialect.suspects_waiting(cursor, backend_name="default", queue_names=["default"])
        found = dialect.suspects(cursor, backend_name="default", queue_names=["default"], limit=8)
    assert [s.id for s in found] == [high, limited, unbounded, low]
    assert [s.bounded for s in found] == [True, True, False, True]
    assert found[1].limit_key == "task:x" and found[1].queue_name == "default"
    assert _claim_suspects(dialect, ["default"]) == [high, limited, unbounded, low]
    with connection.cursor() as cursor:
        assert not dialect.suspects_waiting(cursor, backend_name="default", queue_names=["default"])
    record = TaskRecord.objects.get(id=high)
    # It keeps its mark while it runs: a rescue then knows it ran alone.
    assert (record.status, record.owner, record.attempts) == ("RUNNING", WORKER, 1)
    assert record.available_at == suspect_at()
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


def _claim_announced(
    dialect: Dialect, ids: list[uuid.UUID], queues: list[str] | None = None, scope: Any = None
) -> list[uuid.UUID]:
    sql, params = dialect.claim_announced_sql(
        backend_name="default",
        queue_names=queues,
        worker_id=WORKER,
        task_ids=ids,
        scope=scope or UNLIMITED,
    )
    with connection.cursor() as cursor:
        return sorted(row.id for row in dialect._run_claim(cursor, sql, params))


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's claim by id")
@pytest.mark.django_db(transaction=True)
def test_an_announced_task_is_claimed_by_id_only_where_the_claim_would_take_it_first(
    dialect: Dialect,
) -> None:
    from django_sqltasks.sql import Scope

    now = timezone.now()
    first = task_row(available_at=now - timedelta(seconds=2)).id
    second = task_row(available_at=now - timedelta(seconds=1)).id
    assert _claim_announced(dialect, [first, second]) == sorted([first, second])
    record = TaskRecord.objects.get(id=first)
    assert (record.status, record.owner, record.attempts) == ("RUNNING", WORKER, 1)
    # Claimed already (by this worker or another): nothing.
    assert _claim_announced(dialect, [first]) == []

    # Not yet due, under a limit, of a queue the scope leaves out, of another queue, paused.
    later = task_row(available_at=now + timedelta(hours=1)).id
    limited = task_row(limit_key="task:x").id
    mail = task_row(queue_name="mail").id
    assert _claim_announced(dialect, [later, limited]) == []
    assert _claim_announced(dialect, [mail], queues=["default"]) == []
    assert _claim_announced(dialect, [mail], scope=Scope(exclude_queues=("mail",))) == []
    PausedQueue.objects.create(backend_name="default", queue_name="mail")
    assert _claim_announced(dialect, [mail]) == []
    PausedQueue.objects.all().delete()
    assert _claim_announced(dialect, [mail]) == [mail]

    # A task of a higher priority waits (due or not): the claim of the queues takes it first.
    TaskRecord.objects.filter(id=later).update(priority=5)
    low = task_row(available_at=now).id
    assert _claim_announced(dialect, [low]) == []
    TaskRecord.objects.filter(id=later).delete()
    # An earlier due task of the same priority waits: it comes first too.
    older = task_row(available_at=now - timedelta(seconds=5)).id
    assert _claim_announced(dialect, [low]) == []
    # Announced together, neither holds the other back.
    assert _claim_announced(dialect, [low, older]) == sorted([low, older])
    # A higher priority in another queue of the scope holds it back; outside it, not.
    urgent = task_row(queue_name="mail", priority=9).id
    late = task_row(available_at=now).id
    assert _claim_announced(dialect, [late]) == []
    assert _claim_announced(dialect, [late], queues=["default"]) == [late]
    assert TaskRecord.objects.get(id=urgent).status == "READY"
    assert TaskRecord.objects.get(id=limited).status == "READY"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's claim by id")
@pytest.mark.django_db(transaction=True)
def test_a_task_locked_by_another_claim_is_skipped_by_the_claim_by_id(dialect: Dialect) -> None:
    psycopg = pytest.importorskip("psycopg")
    from django_sqltasks.sql.pg import connection_params

    task = task_row().id
    with psycopg.connect(**connection_params("default")) as other:
        other.execute("SELECT id FROM django_sqltasks_taskrecord WHERE id = %s FOR UPDATE", [task])
        assert _claim_announced(dialect, [task]) == []
    assert _claim_announced(dialect, [task]) == [task]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's notifications")
@pytest.mark.django_db(transaction=True)
def test_one_new_task_due_now_and_unlimited_is_announced_by_its_id(dialect: Dialect) -> None:
    psycopg = pytest.importorskip("psycopg")
    from django_sqltasks.sql.pg import connection_params

    hour_on = timezone.now() + timedelta(hours=1)
    due, later = new_task(), new_task(run_after=hour_on, available_at=hour_on)
    limited = new_task(limit_key="task:x")
    with psycopg.connect(**connection_params("default"), autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        with connection.cursor() as cursor:
            for task in (due, later, limited):
                dialect.insert(cursor, [task], notify=True)
            dialect.insert(cursor, [new_task(), new_task()], notify=True)  # several: the queue
            assert dialect.insert_deduplicated(cursor, new_task("key-1"), notify=True)
        told = [read_announcement(n.payload) for n in listener.notifies(stop_after=5)]
    queue = due.queue_name
    assert told[:4] == [(queue, due.id), (queue, None), (queue, None), (queue, None)]
    assert told[4][0] == queue and told[4][1] is not None


def test_an_announcement_names_a_queue_unless_it_ends_in_a_task_id() -> None:
    task_id = uuid.uuid4()
    assert read_announcement(f"mail{ANNOUNCED_SEP}{task_id}") == ("mail", task_id)
    assert read_announcement("mail") == ("mail", None)
    assert read_announcement("") == (None, None)
    # A queue name that holds the separator itself, but no id after it, is a queue name.
    odd = f"a{ANNOUNCED_SEP}b"
    assert read_announcement(odd) == (odd, None)
    assert read_announcement(f"{odd}{ANNOUNCED_SEP}{task_id}") == (odd, task_id)
