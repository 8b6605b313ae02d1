"""Suspects: the producer is told when a suspect task waits that this worker may run alone."""

from __future__ import annotations

from django_sqltasks.sql.rows import suspect_at
from django_sqltasks.worker.lease import Lease
from django_sqltasks.worker.upkeep.suspects import Suspects
from tests.factories import task_row
from tests.worker.upkeep.conftest import Guard


def test_the_producer_is_told_when_a_suspect_waits(lease: Lease, guard: Guard) -> None:
    told: list[None] = []
    suspects = Suspects(lease, lambda: told.append(None))
    task_row()  # a task due, not a suspect
    suspects.run(guard)
    assert told == []
    task_row(available_at=suspect_at())  # as a rescue leaves a suspect: to run alone
    suspects.run(guard)
    assert len(told) == 1
    assert guard.ran == ["Looking for suspect tasks"] * 2
