"""The days of partitions ahead: a day missing ahead is added (PostgreSQL's partitioned table),
nothing is done elsewhere, and the look comes again once an interval."""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from django.utils import timezone

from django_sqltasks.models import TaskRecord
from django_sqltasks.sql import partitions as sql
from django_sqltasks.store import partitions
from django_sqltasks.store.partitions import partitioned
from django_sqltasks.worker.upkeep.partition_days import PartitionDays
from tests.worker.upkeep.conftest import Guard


def test_a_missing_day_ahead_is_added_and_the_look_waits_an_interval(
    db: None, guard: Guard
) -> None:
    days = PartitionDays(database="default", interval=3600)
    if not partitioned("default"):
        assert days.add() == 0
        return
    last = timezone.now().astimezone(sql.dt_timezone.utc).date()
    last += timedelta(days=partitions.DAYS_AHEAD)
    table = TaskRecord._meta.db_table
    with connection.cursor() as cursor:
        for status in sql.HISTORY:
            [leaf] = [p for p in sql.day_partitions(cursor, table, status) if p.day == last]
            cursor.execute(f"DROP TABLE {sql.q(leaf.name)}")
    days.run(guard)
    assert guard.ran == ["Adding partitions of finished tasks"]
    with connection.cursor() as cursor:
        for status in sql.HISTORY:
            assert last in {p.day for p in sql.day_partitions(cursor, table, status)}
    assert not days.due()
