"""The suspects (``sql/suspects.py`` and each database's form): found best first, taken by id
and cleared, never taken by the main claim; on the active database."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

from django_sqltasks.models import TaskRecord
from django_sqltasks.sql.dialect import Dialect
from django_sqltasks.sql.rows import (
    SUSPECT_CLEARED,
    SUSPECT_TOGETHER,
    SUSPECT_UNBOUNDED,
    stored,
    suspect_at,
)
from tests.factories import task_row
from tests.sql.support import WORKER, claim_batch


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
