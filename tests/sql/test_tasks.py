"""The statements of new tasks and of one task (``sql/tasks.py``): inserts, the live task of a
dedupe key, one result's row, a deferred task made due; on the active database."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord
from django_sqltasks.sql.dialect import Dialect
from django_sqltasks.sql.rows import (
    RESULT_COLUMNS,
)
from tests.factories import task_row
from tests.sql.support import WORKER, claim_batch, new_task


@pytest.mark.django_db(transaction=True)
def test_insert_then_claim_returns_rows_in_full(dialect: Dialect) -> None:
    tasks = [new_task(), new_task(priority=5), new_task(queue_name="other")]
    with connection.cursor() as cursor:
        dialect.insert(cursor, tasks[:2])
        dialect.bulk_insert(cursor, tasks[2:])
    claimed = {row.id: row for row in claim_batch(dialect, queues=["default"])}
    assert set(claimed) == {tasks[0].id, tasks[1].id}
    row = claimed[tasks[1].id]
    assert (row.task_path, row.priority, row.args, row.kwargs) == ("tests.tasks.add", 5, [1, 2], {})
    assert row.attempts == 1 and row.worker_ids == [WORKER] and row.corrupt is None
    assert TaskRecord.objects.get(id=tasks[0].id).owner == WORKER
    assert [r.id for r in claim_batch(dialect)] == [tasks[2].id]  # every queue
    assert claim_batch(dialect) == []


@pytest.mark.django_db
def test_deduplicated_insert_and_the_live_key(dialect: Dialect) -> None:
    first, second = new_task("key-1"), new_task("key-1")
    with connection.cursor() as cursor:
        assert dialect.insert_deduplicated(cursor, first, notify=False)
        assert not dialect.insert_deduplicated(cursor, second, notify=False)
        assert dialect.live_task_with_key(cursor, "key-1") == first.id
        assert dialect.live_task_with_key(cursor, "key-2") is None


def test_result_columns_are_the_task_tables_columns() -> None:
    """What reading a result selects without the model: every column of TaskRecord, in order."""
    assert tuple(field.attname for field in TaskRecord._meta.concrete_fields) == RESULT_COLUMNS


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
    assert [r.id for r in claim_batch(dialect)] != []
    assert TaskRecord.objects.get(id=deferred).status == "RUNNING"
