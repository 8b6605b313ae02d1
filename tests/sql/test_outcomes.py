"""The statements that end an attempt (``sql/outcomes.py``): completions guarded by the owner
and the attempt, the salvage, the requeue of a stopping worker and the rescue."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord, WorkerRecord
from django_sqltasks.sql import Outcome
from django_sqltasks.sql.dialect import Dialect
from django_sqltasks.sql.rows import (
    SUSPECT,
    SUSPECT_CLEARED,
    SUSPECT_TOGETHER,
    SUSPECT_UNBOUNDED,
    stored,
)
from tests.factories import task_row
from tests.sql.support import WORKER


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


# How a rescue treats each RUNNING row of a dead worker that ran another task beside it
# (MAX_RESCUES 2): a task that ran beside others, limited or not, is not charged, and runs
# beside the other suspects of that death next (SUSPECT_TOGETHER); one that ran beside others
# as such a suspect is not charged either, and runs alone next (SUSPECT); one that ran alone (a
# suspect) is charged, and fails once its rescues are spent; one its worker had cleared (it ran
# alone past its time bound) is not charged, and runs alone with no time bound next.
RESCUES = [
    # (mark, limit key, rescues before) -> (status, rescues after, mark after)
    pytest.param(None, None, 0, "READY", 0, SUSPECT_TOGETHER, id="beside-others"),
    pytest.param(None, None, 2, "READY", 2, SUSPECT_TOGETHER, id="beside-others-rescues-spent"),
    pytest.param(SUSPECT_TOGETHER, None, 0, "READY", 0, SUSPECT, id="together-beside-others"),
    pytest.param(SUSPECT_TOGETHER, "k", 2, "READY", 2, SUSPECT, id="together-limited-spent"),
    pytest.param(SUSPECT, None, 0, "READY", 1, SUSPECT, id="alone"),
    pytest.param(SUSPECT, None, 2, "FAILED", 3, None, id="alone-rescues-spent"),
    pytest.param(None, "k", 0, "READY", 0, SUSPECT_TOGETHER, id="limited"),
    pytest.param(None, "k", 2, "READY", 2, SUSPECT_TOGETHER, id="limited-rescues-spent"),
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
    task_row(TaskResultStatus.RUNNING, owner="gone")  # ran beside it
    with connection.cursor() as cursor:
        count = dialect.requeue_orphans(
            cursor, backend_name="default", lease_timeout=30, max_rescues=2
        )
    assert count == 2
    record = TaskRecord.objects.get(id=row.id)
    assert (record.status, record.rescues, record.owner) == (status, after, None)
    if status == "READY":
        assert record.available_at == stored(mark_after)
    message = record.errors[-1]["traceback"]
    assert "gone" in message
    assert ("to run beside the other tasks that lost a worker" in message) is (mark is None)
    assert ("to run alone next time" in message) is (mark is SUSPECT_TOGETHER)
    assert ("to run alone until it ends next time" in message) is (mark is SUSPECT_CLEARED)
    assert ("MAX_RESCUES is 2" in message) is (status == "FAILED")


@pytest.mark.parametrize("mark", [None, SUSPECT_CLEARED, SUSPECT, SUSPECT_TOGETHER])
@pytest.mark.django_db
def test_requeue_orphans_charges_the_one_task_its_worker_ran(
    dialect: Dialect, mark: object
) -> None:
    """Nothing ran beside it, so nothing else can have killed its worker: it is charged, runs
    alone next, and its error does not say that it ran beside others."""
    fields = {"available_at": stored(mark)} if mark is not None else {}
    lone = task_row(TaskResultStatus.RUNNING, owner="gone", **fields)
    pair = [task_row(TaskResultStatus.RUNNING, owner="also-gone") for _ in range(2)]
    with connection.cursor() as cursor:
        count = dialect.requeue_orphans(
            cursor, backend_name="default", lease_timeout=30, max_rescues=2
        )
    assert count == 3
    record = TaskRecord.objects.get(id=lone.id)
    mark_after = SUSPECT_UNBOUNDED if mark is SUSPECT_CLEARED else SUSPECT
    assert (record.status, record.rescues, record.available_at) == ("READY", 1, stored(mark_after))
    assert record.errors[-1]["traceback"] == (
        "Worker gone stopped heartbeating while running this task; it was put back in the queue."
    )
    for row in pair:  # each ran beside the other: not charged
        record = TaskRecord.objects.get(id=row.id)
        assert record.rescues == 0 and "beside others" in record.errors[-1]["traceback"]


@pytest.mark.django_db
def test_a_stop_keeps_suspects_suspects(dialect: Dialect) -> None:
    """A stop puts a suspect back as one (a cleared one with its time bound again), and other
    tasks due at once."""
    marks = [None, SUSPECT, SUSPECT_CLEARED, SUSPECT_UNBOUNDED, SUSPECT_TOGETHER]
    rows = [
        task_row(
            TaskResultStatus.RUNNING,
            owner=WORKER,
            **({"available_at": stored(m)} if m is not None else {}),
        )
        for m in marks
    ]
    with connection.cursor() as cursor:
        assert dialect.requeue_owned(cursor, worker_id=WORKER, reason="stopping") == 5
    after = [TaskRecord.objects.get(id=r.id).available_at for r in rows]
    assert after[0] <= timezone.now()
    assert after[1:] == [stored(m) for m in (SUSPECT, SUSPECT, SUSPECT_UNBOUNDED, SUSPECT_TOGETHER)]


@pytest.mark.parametrize("mark", [SUSPECT, SUSPECT_TOGETHER, SUSPECT_CLEARED, None])
@pytest.mark.parametrize("first", ["marked", "beside"])
@pytest.mark.django_db
def test_a_rescue_judges_every_task_by_its_worker_as_it_was_before_the_rescue(
    dialect: Dialect, mark: object, first: str
) -> None:
    """Two tasks ran on the dead worker: neither is lone, whichever the statement writes first
    (and whether the first one fails, given up). A database that evaluates the statement row by
    row must not count the other as its worker's one task once the first is written."""
    fields = {"available_at": stored(mark)} if mark is not None else {}
    rows = []
    for which in (first, "beside" if first == "marked" else "marked"):
        rows.append(
            task_row(TaskResultStatus.RUNNING, owner="gone", rescues=2, **fields)
            if which == "marked"
            else task_row(TaskResultStatus.RUNNING, owner="gone")
        )
    beside = rows[1] if first == "marked" else rows[0]
    with connection.cursor() as cursor:
        count = dialect.requeue_orphans(
            cursor, backend_name="default", lease_timeout=30, max_rescues=2
        )
    assert count == 2
    record = TaskRecord.objects.get(id=beside.id)
    assert (record.status, record.rescues) == ("READY", 0), record.errors
    assert "beside others" in record.errors[-1]["traceback"]


@pytest.mark.django_db
def test_a_rescue_with_no_lost_worker_reads_once_and_writes_nothing(dialect: Dialect) -> None:
    """Every worker's upkeep runs the rescue now and then; almost always no task has a lost
    worker: one read, no UPDATE."""
    WorkerRecord.objects.create(id="alive", hostname="h", pid=1, heartbeat_at=timezone.now())
    running = task_row(TaskResultStatus.RUNNING, owner="alive")
    with CaptureQueriesContext(connection) as queries, connection.cursor() as cursor:
        assert dialect.requeue_orphans(cursor, backend_name="default", lease_timeout=30) == 0
    assert len(queries) == 1 and queries[0]["sql"].lstrip().startswith("SELECT")
    assert TaskRecord.objects.get(id=running.id).status == "RUNNING"
