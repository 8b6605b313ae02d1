"""The SQL conformance suite: every operation of ``sql/`` on the active database (the same
file runs on SQLite, PostgreSQL and MariaDB), with the plans of the claim, rescue and prune."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord, WorkerRecord
from django_sqltasks.sql import NewTask, Outcome, dialect_for, unsupported_version
from django_sqltasks.sql.dialect import Dialect
from django_sqltasks.sql.rows import (
    RESULT_COLUMNS,
    SUSPECT,
    SUSPECT_CLEARED,
    SUSPECT_UNBOUNDED,
    stored,
    suspect_at,
)
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


@pytest.mark.django_db
def test_facts(dialect: Dialect) -> None:
    assert dialect.wakeup in {"notify", "files", "poll"}
    assert dialect.single_writer is (connection.vendor == "sqlite")
    assert unsupported_version("default") is None
    assert dialect.version_problem() is None
    assert dialect._too_old((1, 0), (2, 0)).endswith("needs " + dialect.product + " 2.0 or newer.")


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


@pytest.mark.django_db
def test_deduplicated_insert_and_the_live_key(dialect: Dialect) -> None:
    first, second = _new("key-1"), _new("key-1")
    with connection.cursor() as cursor:
        assert dialect.insert_deduplicated(cursor, first, notify=False)
        assert not dialect.insert_deduplicated(cursor, second, notify=False)
        assert dialect.live_task_with_key(cursor, "key-1") == first.id
        assert dialect.live_task_with_key(cursor, "key-2") is None


@pytest.mark.django_db
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


@pytest.mark.django_db
def test_an_outcome_of_an_earlier_claim_under_the_same_worker_id_matches_nothing(
    dialect: Dialect,
) -> None:
    """Two processes under one worker id: the task went back to the queue and was claimed
    again (attempt 3); the first process's late outcome (attempt 2) must not end the second's
    claim, whatever the owner says."""
    held = task_row(TaskResultStatus.RUNNING, owner=WORKER, attempts=3).id
    fenced = task_row(TaskResultStatus.RUNNING, owner=WORKER, attempts=3).id
    now = timezone.now()

    def outcome(task_id: uuid.UUID, attempt: int | None) -> Outcome:
        return Outcome(
            id=task_id, status="SUCCESSFUL", finished_at=now, return_value="1", attempt=attempt
        )

    with connection.cursor() as cursor:
        assert dialect.complete(cursor, WORKER, [outcome(held, 2), outcome(fenced, 2)]) == set()
        assert dialect.salvage(cursor, WORKER, outcome(held, 2), "stale") == set()
        assert TaskRecord.objects.filter(status="RUNNING").count() == 2
        assert dialect.complete(cursor, WORKER, [outcome(held, 3), outcome(fenced, 2)]) == {held}
        assert dialect.salvage(cursor, WORKER, outcome(fenced, 3), "current") == {fenced}
    assert TaskRecord.objects.get(id=held).status == "SUCCESSFUL"
    assert TaskRecord.objects.get(id=fenced).status == "FAILED"


@pytest.mark.django_db
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


@pytest.mark.django_db
def test_requeue_owned_keeps_what_it_is_told(dialect: Dialect) -> None:
    kept = task_row(TaskResultStatus.RUNNING, owner=WORKER).id
    released = task_row(TaskResultStatus.RUNNING, owner=WORKER).id
    with connection.cursor() as cursor:
        count = dialect.requeue_owned(cursor, worker_id=WORKER, reason="stopping", keep=[kept])
    assert count == 1
    assert TaskRecord.objects.get(id=kept).status == "RUNNING"
    record = TaskRecord.objects.get(id=released)
    assert record.status == "READY" and record.errors[-1]["traceback"] == "stopping"


# How a rescue treats each RUNNING row of a dead worker (MAX_RESCUES 2): a task that ran beside
# others, limited or not, is not charged, and runs alone next (a suspect); one that ran alone (a
# suspect) is charged, and fails once its rescues are spent; one its worker had cleared (it ran
# alone past its time bound) is not charged, and runs alone with no time bound next.
RESCUES = [
    # (mark, limit key, rescues before) -> (status, rescues after, mark after)
    pytest.param(None, None, 0, "READY", 0, SUSPECT, id="beside-others"),
    pytest.param(None, None, 2, "READY", 2, SUSPECT, id="beside-others-rescues-spent"),
    pytest.param(SUSPECT, None, 0, "READY", 1, SUSPECT, id="alone"),
    pytest.param(SUSPECT, None, 2, "FAILED", 3, None, id="alone-rescues-spent"),
    pytest.param(None, "k", 0, "READY", 0, SUSPECT, id="limited"),
    pytest.param(None, "k", 2, "READY", 2, SUSPECT, id="limited-rescues-spent"),
    pytest.param(SUSPECT, "k", 2, "FAILED", 3, None, id="limited-alone-rescues-spent"),
    pytest.param(SUSPECT_CLEARED, None, 2, "READY", 2, SUSPECT_UNBOUNDED, id="cleared"),
    pytest.param(SUSPECT_UNBOUNDED, None, 0, "READY", 1, SUSPECT_UNBOUNDED, id="unbounded"),
    pytest.param(SUSPECT_UNBOUNDED, None, 2, "FAILED", 3, None, id="unbounded-spent"),
]


@pytest.mark.parametrize(("mark", "limit_key", "before", "status", "after", "mark_after"), RESCUES)
@pytest.mark.django_db
def test_requeue_orphans_charges_only_tasks_that_ran_alone(
    dialect: Dialect,
    mark: object,
    limit_key: str | None,
    before: int,
    status: str,
    after: int,
    mark_after: object,
) -> None:
    fields = {"available_at": stored(mark)} if mark is not None else {}
    row = task_row(
        TaskResultStatus.RUNNING, owner="gone", rescues=before, limit_key=limit_key, **fields
    )
    with connection.cursor() as cursor:
        count = dialect.requeue_orphans(
            cursor, backend_name="default", lease_timeout=30, max_rescues=2
        )
    assert count == 1
    record = TaskRecord.objects.get(id=row.id)
    assert (record.status, record.rescues, record.owner) == (status, after, None)
    if status == "READY":
        assert record.available_at == stored(mark_after)
    message = record.errors[-1]["traceback"]
    assert "gone" in message
    assert ("to run alone next time" in message) is (mark is None)
    assert ("to run alone until it ends next time" in message) is (mark is SUSPECT_CLEARED)
    assert ("MAX_RESCUES is 2" in message) is (status == "FAILED")


@pytest.mark.django_db
def test_a_stop_keeps_suspects_suspects(dialect: Dialect) -> None:
    """A stop puts a suspect back as one (a cleared one with its time bound again), and other
    tasks due at once."""
    marks = [None, SUSPECT, SUSPECT_CLEARED, SUSPECT_UNBOUNDED]
    rows = [
        task_row(
            TaskResultStatus.RUNNING,
            owner=WORKER,
            **({"available_at": stored(m)} if m is not None else {}),
        )
        for m in marks
    ]
    with connection.cursor() as cursor:
        assert dialect.requeue_owned(cursor, worker_id=WORKER, reason="stopping") == 4
    after = [TaskRecord.objects.get(id=r.id).available_at for r in rows]
    assert after[0] <= timezone.now()
    assert after[1:] == [stored(SUSPECT), stored(SUSPECT), stored(SUSPECT_UNBOUNDED)]


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
    assert [r.id for r in _claim(dialect)] == [due]
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


@pytest.mark.django_db
def test_live_workers_like_matches_the_prefix_literally(dialect: Dialect) -> None:
    for worker_id in ("web-1", "web-2", "web_x-1", "webs-1", "stale-1"):
        WorkerRecord.objects.create(id=worker_id, backend_name="default", pid=1)
    WorkerRecord.objects.filter(id="stale-1").update(
        heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    with connection.cursor() as cursor:
        for worker_id in ("web-1", "web-2", "web_x-1", "webs-1", "stale-1"):
            dialect.heartbeat(cursor, worker_id) if worker_id != "stale-1" else None
        assert sorted(r[0] for r in dialect.live_workers_like(cursor, "web-", 30)) == [
            "web-1",
            "web-2",
        ]
        assert [r[0] for r in dialect.live_workers_like(cursor, "web_", 30)] == ["web_x-1"]
        assert dialect.live_workers_like(cursor, "stale-", 30) == []


@pytest.mark.django_db
def test_ping_result_select_and_error_kinds(dialect: Dialect) -> None:
    row = task_row()
    with connection.cursor() as cursor:
        dialect.ping(cursor)
        cursor.execute(
            dialect.select_result_sql(RESULT_COLUMNS), [dialect._encode_id(row.id), "default"]
        )
        values = dict(zip(RESULT_COLUMNS, cursor.fetchone(), strict=True))
        assert values["status"] == "READY"
        assert values["task_path"] == row.task_path
        with pytest.raises(DatabaseError) as refused:
            cursor.execute("SELECT no_such_column FROM django_sqltasks_nothing")
    assert not dialect.is_transient(refused.value)
    assert not dialect.is_contention(refused.value)


def test_result_columns_are_the_task_tables_columns() -> None:
    """What reading a result selects without the model: every column of TaskRecord, in order."""
    assert tuple(field.attname for field in TaskRecord._meta.concrete_fields) == RESULT_COLUMNS


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


# The rest of the operations: every public method of the dialect is called on each database.


@pytest.mark.django_db
def test_the_database_clock_and_the_worker_table(dialect: Dialect) -> None:
    from django_sqltasks.models import WorkerRecord

    before = timezone.now()
    with connection.cursor() as cursor:
        now = dialect.db_now(cursor)
    assert now.tzinfo is not None and abs((now - before).total_seconds()) < 5
    WorkerRecord.objects.create(id="alive", backend_name="default", pid=11, hostname="here")
    WorkerRecord.objects.create(
        id="silent", backend_name="default", heartbeat_at=before - timedelta(minutes=10)
    )
    with connection.cursor() as cursor:
        assert dialect.heartbeat(cursor, "alive")
        assert not dialect.heartbeat(cursor, "nobody")
        assert dialect.live_worker(cursor, "alive", lease_timeout=30) == (11, "here", "")
        assert dialect.live_worker(cursor, "silent", lease_timeout=30) is None
        assert dialect.forget_dead_workers(cursor, lease_timeout=30) == 1
    assert set(WorkerRecord.objects.values_list("id", flat=True)) == {"alive"}
    assert WorkerRecord.objects.get(id="alive").heartbeat_at >= before - timedelta(seconds=5)


@pytest.mark.django_db(transaction=True)
def test_limit_keys_are_found_one_probe_a_key_and_claimed_in_their_scope(
    dialect: Dialect,
) -> None:
    from django_sqltasks.sql import Scope

    tasks = [_new(limit_key=key) for key in ("b", "a", "a", "c")] + [_new()]
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
    assert [r.id for r in _claim(dialect)] == [tasks[4].id]


@pytest.mark.django_db(transaction=True)
def test_make_due_moves_only_a_deferred_ready_task(dialect: Dialect) -> None:
    later = timezone.now() + timedelta(hours=1)
    deferred = task_row(available_at=later, run_after=later).id
    due = task_row().id
    running = task_row(TaskResultStatus.RUNNING, available_at=later).id
    with connection.cursor() as cursor:
        assert dialect.make_due(cursor, backend_name="default", task_id=deferred)
        assert not dialect.make_due(cursor, backend_name="default", task_id=due)
        assert not dialect.make_due(cursor, backend_name="default", task_id=running)
        assert not dialect.make_due(cursor, backend_name="other", task_id=deferred)
        assert not dialect.make_due(cursor, backend_name="default", task_id=uuid.uuid4())
        dialect.announce(cursor, ["default"])  # a NOTIFY on PostgreSQL, nothing elsewhere
    assert [r.id for r in _claim(dialect)] != []
    assert TaskRecord.objects.get(id=deferred).status == "RUNNING"


@pytest.mark.django_db
def test_table_health_location_and_statement_limits(dialect: Dialect) -> None:
    with connection.cursor() as cursor:
        health = dialect.table_health(cursor)
    if connection.vendor == "sqlite":
        assert not health.known
    else:
        assert health.known
        assert health.live_rows is None or health.live_rows >= 0
    assert dialect.location()
    limit = dialect.max_statement_bytes()
    small = Outcome(id=uuid.uuid4(), status="SUCCESSFUL", finished_at=None, return_value="1")
    assert dialect.outcome_problem(small) is None
    if limit is None:
        assert connection.vendor != "mysql"
    else:
        huge = Outcome(
            id=uuid.uuid4(), status="SUCCESSFUL", finished_at=None, return_value="1" * limit
        )
        problem = dialect.outcome_problem(huge)
        assert problem is not None and "max_allowed_packet" in problem


@pytest.mark.django_db
def test_a_missing_table_is_told_apart_from_other_errors(dialect: Dialect) -> None:
    with connection.cursor() as cursor, pytest.raises(DatabaseError) as missing:
        cursor.execute("SELECT 1 FROM django_sqltasks_no_such_table")
    assert dialect.names_missing_table(missing.value)
    assert dialect.names_missing_table(missing.value.__cause__ or missing.value)
    assert not dialect.names_missing_table(ValueError("no such table"))


SOUND_ROW = (
    "0196f5a2-1c3e-7b4d-8e9f-a0b1c2d3e4f5",
    "tests.tasks.add",
    "default",
    "default",
    0,
    "[1, 2]",
    '{"x": [3]}',
    "2026-01-02T03:04:05.123456+00:00",
    None,
    "2026-01-02T03:04:06+00:00",
    "2026-01-02T03:04:07+00:00",
    "[]",
    '["w"]',
    1,
    0,
    None,
    None,
)


def _damaged(index: int, value: object) -> tuple[object, ...]:
    return (*SOUND_ROW[:index], value, *SOUND_ROW[index + 1 :])


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        (SOUND_ROW, None),
        (_damaged(5, "[1, "), "column args holds text that cannot be decoded as JSON"),
        (_damaged(6, "[]"), "column kwargs holds a JSON list, not a object"),
        (_damaged(11, '"text"'), "column errors holds a JSON str, not a list"),
        (_damaged(12, "[" * 1030 + "]" * 1030), "column worker_ids holds text that cannot be"),
        (_damaged(9, "yesterday"), "a date column holds 'yesterday'"),
        (_damaged(0, "{0196f5a2-1c3e-7b4d-8e9f-a0b1c2d3e4f5}"), None),  # UUID() reads braces
    ],
)
def test_a_claimed_row_decoded_in_one_pass_matches_one_checked_column_by_column(
    dialect: Dialect, values: tuple[object, ...], problem: str | None
) -> None:
    """The one-pass decoding of a claimed row gives the same row as the column-by-column one,
    and leaves any row it does not take whole to it, which says what is wrong."""
    row = dialect._claimed_row(values)
    if problem is None or "date" not in problem:  # a bad date reads as the time it is read
        assert row == dialect._checked_claimed_row(values)
    if problem is None:
        assert dialect._sound_claimed_row(values) == row and row.corrupt is None
        assert row.id == uuid.UUID("0196f5a2-1c3e-7b4d-8e9f-a0b1c2d3e4f5")
        assert (row.args, row.kwargs, row.worker_ids) == ([1, 2], {"x": [3]}, ["w"])
        assert row.enqueued_at.isoformat() == "2026-01-02T03:04:05.123456+00:00"
    else:
        assert row.corrupt is not None and row.corrupt.startswith(problem)


def test_the_rows_of_one_claim_each_get_their_own_times_and_their_id_as_text(
    dialect: Dialect,
) -> None:
    """Decoding reuses a time already decoded for the same text (the rows of one claim share
    its clock); a row whose times differ still gets its own, and the text id is the UUID's."""
    retried = list(SOUND_ROW)
    retried[0] = "0196f5a2-1c3e-7b4d-8e9f-a0b1c2d3e4f6"
    retried[9] = "2026-01-01T00:00:00+00:00"  # started on an earlier attempt
    first = list(SOUND_ROW)
    first[10] = first[9]  # a first attempt: both times are the claim's
    rows = [dialect._claimed_row(values) for values in (SOUND_ROW, retried, first, SOUND_ROW)]
    for row, values in zip(rows, (SOUND_ROW, retried, first, SOUND_ROW), strict=True):
        assert row.started_at.isoformat() == values[9]
        assert row.last_attempted_at.isoformat() == values[10]
        assert row.text_id == str(row.id) == values[0]
    assert rows[2].last_attempted_at is rows[2].started_at is rows[3].started_at  # decoded once
