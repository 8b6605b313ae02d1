"""The indexes of the durable tables serve their queries, with thousands of rows present: a
task's steps (each run's first step), the admin's filter of waiting tasks, and the pruning of
events no task waited for."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_sqltasks.models import EventRecord, StepRecord, TaskRecord
from django_sqltasks.sql.rows import parked_at
from tests.factories import insert_rows
from tests.test_indexes import add_ready, claim_reads
from tests.test_indexes import analyze as indexes_analyze

# ANALYZE TABLE commits on MySQL; every test fills a table with thousands of rows.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.large_table]


def analyze() -> None:
    with connection.cursor() as cursor:
        for model in (StepRecord, EventRecord):
            table = model._meta.db_table
            if connection.vendor == "postgresql":
                cursor.execute(f"ANALYZE {table}")
            elif connection.vendor == "sqlite":
                cursor.execute("ANALYZE")
            else:
                cursor.execute(f"ANALYZE TABLE {table}")
                cursor.fetchall()


@pytest.fixture
def filled() -> uuid.UUID:
    """5,000 tasks' steps (a few waiting), and 5,000 events (most received by a task)."""
    now = timezone.now()
    tasks = [uuid.uuid4() for _ in range(5000)]
    StepRecord.objects.bulk_create(
        StepRecord(
            task_id=task_id,
            kind="step",
            name=name,
            state="waiting" if i % 500 == 0 and name == "b" else "done",
            started_at=now,
        )
        for i, task_id in enumerate(tasks)
        for name in ("a", "b")
    )
    EventRecord.objects.bulk_create(
        EventRecord(
            name="e",
            key=str(i),
            sent_at=now - timedelta(days=i % 30),
            task_id=None if i % 100 == 0 else tasks[i],
        )
        for i in range(5000)
    )
    analyze()
    return tasks[1234]


def test_a_tasks_steps_are_read_by_the_unique_index(filled: uuid.UUID) -> None:
    plan = StepRecord.objects.filter(task_id=filled).order_by().explain()
    # SQLite names the index of a unique constraint itself.
    unique = "sqlite_autoindex_" if connection.vendor == "sqlite" else "sqltasks_step_unique"
    assert unique in plan, plan


def test_the_waiting_filter_reads_the_waiting_index(filled: uuid.UUID) -> None:
    plan = StepRecord.objects.filter(state="waiting").values("task_id").explain()
    assert "sqltasks_step_waiting_idx" in plan, plan


def test_pruning_unclaimed_events_reads_their_index(filled: uuid.UUID) -> None:
    old = timezone.now() - timedelta(days=20)
    plan = EventRecord.objects.filter(task_id__isnull=True, sent_at__lte=old).explain()
    assert "sqltasks_event_unclaimed_idx" in plan, plan


def park_10_000() -> None:
    """10,000 tasks stopped at a sleep or a wait: READY rows due in an hour or more, or in the
    year 9999 (a wait without a timeout)."""
    now = timezone.now()
    insert_rows(
        TaskRecord(task_path="tests.tasks_durable.waiter", backend_name="default"),
        10_000,
        lambda i: {"available_at": parked_at() if i % 2 else now + timedelta(hours=1, seconds=i)},
    )
    indexes_analyze()


def test_ten_thousand_waiting_tasks_cost_the_claim_nothing() -> None:
    """Tasks stopped at a sleep or a wait are READY rows due later (or in the year 9999):
    beside 10,000 of them, a claim of due tasks reads about what it reads without them."""
    add_ready(*[("default", 0, -i) for i in range(1, 101)])
    indexes_analyze()
    alone = claim_reads(["default"])
    park_10_000()
    beside = claim_reads(["default"])
    print(f"\n[{connection.vendor}] a claim's reads: {alone} alone, {beside} beside 10,000 waiting")
    assert beside <= 2 * alone + 20, (alone, beside)


def test_a_claim_that_finds_nothing_due_reads_no_more_beside_10_000_waiting() -> None:
    """What an idle worker's claims meet: no task due, 10,000 stopped at a sleep or a wait."""
    indexes_analyze()
    alone = claim_reads(["default"])
    park_10_000()
    beside = claim_reads(["default"])
    print(
        f"\n[{connection.vendor}] a claim that finds nothing due reads {alone} alone, "
        f"{beside} beside 10,000 waiting"
    )
    assert beside <= alone + 10, (alone, beside)
