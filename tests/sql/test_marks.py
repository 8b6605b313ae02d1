"""The claim's marks (``sql/marks.py``): where each priority's next claim starts reading, what
still becomes due behind a mark, and what a claim with marks reads beside a held snapshot."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.utils import timezone

from django_sqltasks.models import TaskRecord
from django_sqltasks.sql import ClaimedRow
from django_sqltasks.sql.dialect import Dialect
from django_sqltasks.sql.marks import (
    FULL_PASS_EVERY,
    FULL_PASS_EVERY_MAX,
    FULL_PASS_SHARE,
    MAX_LAG,
    NO_MARKS,
    SLOP,
    ClaimFeedback,
    ClaimMarks,
    full_pass_interval,
)
from django_sqltasks.sql.rows import Outcome
from tests.factories import held_snapshot, task_row
from tests.sql.support import WORKER, claim_batch

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the claim's marks are PostgreSQL's"
)
NEVER = 1e9  # seconds: a full pass only at the first claim
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _feedback(taken: dict[int, datetime], xmin: int, xmax: int, at: datetime) -> ClaimFeedback:
    return ClaimFeedback(taken=taken, xmin=xmin, xmax=xmax, at=at)


# The marks' own rules, without a database ------------------------------------------------


def test_the_first_claim_is_a_full_pass_and_marks_follow_what_it_took() -> None:
    marks = ClaimMarks(full_pass_every=NEVER)
    assert marks.begin() == NO_MARKS
    # Nothing else was writing (xmin = xmax): a mark goes as far as the claim took.
    marks.end(_feedback({0: T0, 5: T0 - timedelta(seconds=3)}, 100, 100, T0 + SLOP))
    assert marks.marks == {0: T0, 5: T0 - timedelta(seconds=3)}
    below, starts = marks.begin()
    below_values = below.strip("{}").split(",")
    start_values = starts.strip("{}").split(",")
    assert len(below_values) == len(start_values) == 202
    # The walk's stops: below priority 6 the next mark is 5; below 5 and down to 1, 0; below
    # 0, none.
    assert below_values[6 + 100] == "5" and below_values[5 + 100] == "0"
    assert below_values[1 + 100] == "0" and below_values[0 + 100] == "NULL"
    assert below_values[101 + 100] == "5"  # the walk's start, above every priority
    assert start_values[0 + 100] == T0.isoformat(timespec="microseconds")
    assert start_values[1 + 100] == "NULL"


def test_a_mark_stays_before_a_write_still_in_progress() -> None:
    marks = ClaimMarks(full_pass_every=NEVER)
    marks.begin()
    # The first claim's snapshot: xids from 200 on were not assigned yet at T0.
    marks.end(_feedback({}, 200, 200, T0))
    # A write that took xid 205, after T0, is still open at the next claim (its xmin): of the
    # snapshots, only the first has an xmax at or below it, so the mark stays at T0 - SLOP.
    marks.begin()
    later = T0 + timedelta(seconds=1)
    marks.end(_feedback({0: later}, 205, 230, later))
    assert marks.marks == {0: T0 - SLOP}
    # The write is done: the next claim's xmin is past every snapshot, and the mark moves on
    # (to SLOP before the claim's snapshot at most).
    marks.begin()
    last = T0 + timedelta(seconds=1.5)
    marks.end(_feedback({0: last}, 240, 240, last))
    assert marks.marks == {0: last - SLOP}


def test_a_mark_stays_at_most_max_lag_behind_the_claim() -> None:
    marks = ClaimMarks(full_pass_every=NEVER)
    marks.begin()
    marks.end(_feedback({}, 10, 10, T0))
    # A writer (xid 10) open for a minute: the mark moves on regardless, MAX_LAG behind.
    at = T0 + timedelta(minutes=1)
    marks.begin()
    marks.end(_feedback({0: at}, 10, 500, at))
    assert marks.marks == {0: at - MAX_LAG}


def test_marks_never_move_back_and_a_failed_claim_keeps_them() -> None:
    marks = ClaimMarks(full_pass_every=NEVER)
    marks.begin()
    marks.end(_feedback({0: T0}, 1, 1, T0 + SLOP))
    marks.begin()
    # A full pass that took a task due long ago (behind the mark) leaves the mark where it is.
    marks.end(_feedback({0: T0 - timedelta(hours=1)}, 2, 2, T0 + timedelta(seconds=1)))
    marks.begin()
    marks.end(None)
    assert marks.marks == {0: T0}
    marks.reset()
    assert marks.marks == {} and marks.begin() == NO_MARKS


def test_a_full_pass_that_took_only_tasks_behind_a_mark_moves_it_back_to_them() -> None:
    marks = ClaimMarks(full_pass_every=NEVER)
    marks.begin()
    marks.end(_feedback({0: T0, 3: T0}, 1, 1, T0 + SLOP))
    marks._next_full_pass = 0.0  # the next claim is a full pass
    assert marks.begin() == NO_MARKS
    # Priority 0: the tasks it took were all behind the mark; 3: one at the mark or past it.
    behind = T0 - timedelta(seconds=30)
    marks.end(_feedback({0: behind, 3: T0 + timedelta(seconds=1)}, 2, 2, T0 + timedelta(seconds=2)))
    assert marks.marks == {0: behind, 3: T0 + timedelta(seconds=1)}


def test_full_passes_come_at_their_interval_and_a_slow_one_puts_the_next_off() -> None:
    marks = ClaimMarks(full_pass_every=NEVER)
    marks.begin()
    marks.end(_feedback({0: T0}, 1, 1, T0 + SLOP))
    assert marks.full_passes == 1
    assert marks.begin() != NO_MARKS
    assert full_pass_interval(0.001) == FULL_PASS_EVERY
    # 100 ms a pass: no more than FULL_PASS_SHARE of the time on full passes.
    assert full_pass_interval(0.1) == pytest.approx(0.1 / FULL_PASS_SHARE)
    assert full_pass_interval(30.0) == FULL_PASS_EVERY_MAX


# The claim with marks, on PostgreSQL ----------------------------------------------------


def _claim(dialect: Dialect, marks: ClaimMarks, limit: int = 10) -> list[ClaimedRow]:
    return claim_batch(dialect, limit=limit, marks=marks)


# A task row written by the database itself, due at ``due`` (SQL), from ``source`` (SQL after
# the values: a FROM clause, or nothing).
INSERT_TASK = (
    "INSERT INTO django_sqltasks_taskrecord (id, task_path, backend_name, queue_name, priority, "
    "status, args, kwargs, errors, worker_ids, attempts, rescues, snoozes, enqueued_at, "
    "available_at) SELECT gen_random_uuid(), 'tests.tasks.add', 'default', 'default', 0, "
    "'READY', '[]', '{{}}', '[]', '[]', 0, 0, 0, statement_timestamp(), {due} {source}"
)


def _finish(dialect: Dialect, rows: list[ClaimedRow]) -> None:
    now = timezone.now()
    outcomes = [
        Outcome(
            id=row.id,
            status="SUCCESSFUL",
            finished_at=now,
            return_value="null",
            error_class=None,
            error_traceback=None,
            available_at=None,
            snoozed=0,
            delay=None,
            attempt=row.attempts,
        )
        for row in rows
    ]
    with connection.cursor() as cursor:
        dialect.complete(cursor, WORKER, outcomes)


def _due(seconds_ago: float, **fields: Any) -> TaskRecord:
    return task_row(available_at=timezone.now() - timedelta(seconds=seconds_ago), **fields)


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_priority_new_to_the_claim_comes_first_above_and_in_order_below(
    dialect: Dialect,
) -> None:
    marks = ClaimMarks(full_pass_every=NEVER)
    zeros = [_due(1.0 - i / 100).id for i in range(4)]
    assert [r.id for r in _claim(dialect, marks, limit=2)] == zeros[:2]  # the full pass
    assert set(marks.marks) == {0}
    high, low = _due(5.0, priority=7).id, _due(5.0, priority=-3).id
    mid = _due(5.0, priority=3).id
    # Found between the marks (above priority 0, and below it), each read from its start.
    claimed = [r.id for r in _claim(dialect, marks, limit=10)]
    assert claimed == [high, mid, *zeros[2:], low]
    assert set(marks.marks) == {7, 3, 0, -3}
    assert marks.full_passes == 1


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_tasks_enqueued_at_one_time_are_all_taken_past_a_mark(dialect: Dialect) -> None:
    marks = ClaimMarks(full_pass_every=NEVER)
    at = timezone.now() - timedelta(seconds=1)
    ids = {task_row(available_at=at).id for _ in range(7)}  # as one multi-row INSERT does
    taken: set[Any] = set()
    for _ in range(4):
        taken |= {r.id for r in _claim(dialect, marks, limit=2)}
    assert taken == ids


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_task_due_behind_the_mark_waits_for_the_next_full_pass(dialect: Dialect) -> None:
    marks = ClaimMarks(full_pass_every=NEVER)
    first = _due(0.5).id
    assert [r.id for r in _claim(dialect, marks)] == [first]
    # run_after an hour ago: due before the mark, so a claim from the mark does not see it.
    behind = _due(3600.0).id
    assert _claim(dialect, marks) == []
    marks.reset()  # as the next full pass does
    assert [r.id for r in _claim(dialect, marks)] == [behind]


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_backlog_behind_the_mark_is_read_by_the_claims_after_one_full_pass(
    dialect: Dialect,
) -> None:
    """Tasks that came due behind the mark in bulk (enqueues that took their transaction id
    late, behind a lock) wait for one full pass, not one full pass each ``limit`` of them:
    at 800 tasks/s beside held snapshots, with full passes a minute apart, a worker took 85
    tasks a second while 60,000 waited behind its mark."""
    marks = ClaimMarks(full_pass_every=NEVER)
    first = _due(0.5).id
    assert [r.id for r in _claim(dialect, marks)] == [first]
    backlog = {_due(30.0 + i / 100).id for i in range(25)}
    assert _claim(dialect, marks, limit=5) == []  # behind the mark
    marks._next_full_pass = 0.0  # the next full pass is due
    taken = {r.id for r in _claim(dialect, marks, limit=5)}
    for _ in range(4):  # the claims after it, from the mark it moved back
        taken |= {r.id for r in _claim(dialect, marks, limit=5)}
    assert taken == backlog and marks.full_passes == 2


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_task_whose_enqueue_commits_after_later_claims_is_not_left_behind(
    dialect: Dialect,
) -> None:
    marks = ClaimMarks(full_pass_every=NEVER)
    _claim(dialect, marks)  # the full pass, on an empty table
    other = connections.create_connection("default")
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            # Its available_at is its statement's time, before the tasks claimed below.
            cursor.execute(INSERT_TASK.format(due="statement_timestamp()", source="RETURNING id"))
            late = cursor.fetchone()[0]
        for _ in range(3):
            _due(0.0)
            assert len(_claim(dialect, marks)) == 1
        assert set(marks.marks) == {0}
        other.commit()
    finally:
        other.close()
    assert [r.id for r in _claim(dialect, marks)] == [late]
    assert marks.full_passes == 1


def _claim_buffers(dialect: Dialect, marks: tuple[str, str]) -> int:
    sql, params = dialect.claim_sql(  # type: ignore[call-arg]
        backend_name="default", queue_names=None, worker_id=WORKER, limit=10, marks=marks
    )
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT) " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("ROLLBACK")
    # What finding the rows read (the walk over priorities and each one's due range, under
    # "CTE picked"), not what updating them writes.
    found = re.search(r"CTE picked\n.*?Buffers: shared hit=(\d+)(?: read=(\d+))?", plan, re.S)
    assert found, plan
    return int(found.group(1)) + int(found.group(2) or 0)


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_beside_a_held_snapshot_a_claim_with_marks_reads_past_what_was_consumed(
    dialect: Dialect,
) -> None:
    marks = ClaimMarks(full_pass_every=NEVER)
    with held_snapshot():
        # 6,000 tasks claimed and finished while the snapshot is held: vacuum can remove
        # none of the versions they leave in the ready index.
        with connection.cursor() as cursor:
            cursor.execute(
                INSERT_TASK.format(
                    due="now() - make_interval(secs => 10) + g * interval '1 ms'",
                    source="FROM generate_series(1, 6000) AS g",
                )
            )
        while rows := _claim(dialect, marks, limit=200):
            _finish(dialect, rows)
        for _ in range(5):
            _due(0.0)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM django_sqltasks_taskrecord_live")
        marked = _claim_buffers(dialect, marks.begin())
        full = _claim_buffers(dialect, NO_MARKS)
    # The full pass walks the 6,000 consumed entries and their heap tuples (about 30 index
    # pages and 300 heap pages, read in order); the claim from the mark does not.
    assert full > 200 and marked * 10 < full, (marked, full)
