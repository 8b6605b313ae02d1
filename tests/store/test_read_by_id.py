"""Reads by id on PostgreSQL's partitioned table plan only the partitions the task may be in:
the live one, and the finished days from the day of its UUIDv7 id (less ID_CLOCK_SKEW) on.
Elsewhere, and for an id that is not a UUIDv7, a read by id is the plain one."""

from __future__ import annotations

import os
import re
import uuid
from datetime import date, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus, task_backends
from django_sqltasks.ids import ID_CLOCK_SKEW, finished_not_before, first_id_at, new_task_id
from django_sqltasks.models import TaskRecord
from django_sqltasks.sql import dialect_for
from django_sqltasks.sql import partitions as sql
from django_sqltasks.sql.rows import RESULT_COLUMNS
from django_sqltasks.store import control, partitions
from tests.factories import task_row

pytestmark = pytest.mark.django_db  # on PostgreSQL, the days added here roll back with the test

TABLE = TaskRecord._meta.db_table
postgresql_only = pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="PostgreSQL partitions"
)


def id_made_at(moment: datetime) -> uuid.UUID:
    """A UUIDv7 task id made at ``moment`` (RFC 9562 variant, random low bits)."""
    random_bits = int.from_bytes(os.urandom(7), "big")
    task_id = uuid.UUID(int=first_id_at(moment).int | 0b10 << 62 | random_bits)
    assert task_id.version == 7
    return task_id


def today() -> date:
    return timezone.now().astimezone(sql.dt_timezone.utc).date()


def add_old_days(days_back: int) -> None:
    partitions.add_days("default", days_ahead=days_back, today=today() - timedelta(days_back))


def read(task_id: uuid.UUID) -> TaskRecord | None:
    """The task, read by id as get_result reads it."""
    partitioned = partitions.partitioned_recently("default")
    return TaskRecord.objects.with_id(task_id, partitioned=partitioned).first()


def finished(days_ago: float, *, task_id: uuid.UUID, status: str = "SUCCESSFUL") -> TaskRecord:
    return task_row(status, finished_ago=timedelta(days=days_ago), id=task_id)


@pytest.mark.parametrize(
    ("made_days_ago", "finished_days_ago"),
    [
        (0, 0),  # enqueued and finished today
        (6, 0),  # finished days after it was enqueued
        (6, 5),  # in an old day of its own
        (0, 0.5),  # finished "before" it was enqueued, within the clock skew allowed
        (400, 399.9),  # in the default partition (no day of its own)
    ],
)
def test_a_finished_task_is_found_by_id(made_days_ago: float, finished_days_ago: float) -> None:
    if connection.vendor == "postgresql":
        add_old_days(10)
    now = timezone.now()
    task = finished(finished_days_ago, task_id=id_made_at(now - timedelta(days=made_days_ago)))
    assert read(task.pk) == task
    assert task_backends["default"].get_result(str(task.pk)).status == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize("status", [TaskResultStatus.READY, TaskResultStatus.RUNNING])
def test_a_live_task_is_found_by_id(status: str) -> None:
    task = task_row(status, id=id_made_at(timezone.now() - timedelta(days=30)))
    assert read(task.pk) == task
    assert task_backends["default"].get_result(str(task.pk)).status == status


@pytest.mark.parametrize(
    "task_id",
    [uuid.uuid4(), id_made_at(timezone.now() + timedelta(days=3))],
    ids=["uuid4", "uuid7 of the future"],
)
def test_an_id_that_tells_nothing_is_read_over_every_partition(task_id: uuid.UUID) -> None:
    assert finished_not_before(task_id) is None
    if connection.vendor == "postgresql":
        add_old_days(10)
    task = finished(8, task_id=task_id, status="FAILED")
    assert read(task.pk) == task
    assert task_backends["default"].get_result(str(task.pk)).status == TaskResultStatus.FAILED
    assert task_backends["default"].cancel(str(task.pk)) is False  # found, and finished


def test_a_finished_task_without_finished_at_is_found() -> None:
    task = task_row(TaskResultStatus.SUCCESSFUL, id=new_task_id())
    TaskRecord.objects.filter(pk=task.pk).update(finished_at=None)
    assert read(task.pk) == task


def test_cancel_by_id_finds_a_ready_task() -> None:
    task = task_row(TaskResultStatus.READY, id=new_task_id())
    assert control.cancel_by_id("default", "default", str(task.pk)) is True


@pytest.mark.skipif("connection.vendor == 'postgresql'", reason="only PostgreSQL partitions")
def test_elsewhere_a_read_by_id_is_the_plain_one() -> None:
    task_id = new_task_id()
    assert partitions.partitioned_recently("default") is False
    plain = TaskRecord.objects.filter(id=task_id)
    assert str(TaskRecord.objects.with_id(task_id, partitioned=False).query) == str(plain.query)


def planned_leaves(plan: str) -> set[str]:
    """The partitions of the task table an EXPLAIN scans."""
    return set(re.findall(r" on \"?(" + TABLE + r"_\w+)", plan))


def expected_leaves(task_id: uuid.UUID) -> set[str]:
    earliest = finished_not_before(task_id)
    assert earliest is not None
    first = earliest.astimezone(sql.dt_timezone.utc).date()
    with connection.cursor() as cursor:
        days = {
            p.name
            for status in sql.HISTORY
            for p in sql.day_partitions(cursor, TABLE, status)
            if p.day >= first
        }
    defaults = {sql.default_partition(TABLE, status) for status in sql.HISTORY}
    return {sql.live(TABLE), *days, *defaults}


@postgresql_only
def test_a_read_by_id_plans_only_the_partitions_the_task_may_be_in() -> None:
    add_old_days(20)
    task_id = id_made_at(timezone.now() - timedelta(days=5))
    plan = TaskRecord.objects.with_id(task_id, partitioned=True).explain()
    leaves = planned_leaves(plan)
    assert leaves == expected_leaves(task_id), plan
    # The live partition; per status the id's day less one, 5 days more, today, the days
    # ahead; the defaults.
    assert len(leaves) == 1 + 2 * (7 + partitions.DAYS_AHEAD) + 2
    everything = planned_leaves(TaskRecord.objects.filter(id=task_id).explain())
    assert len(everything) == 1 + 2 * (21 + partitions.DAYS_AHEAD) + 2


@postgresql_only
def test_the_async_read_by_id_plans_only_the_partitions_the_task_may_be_in() -> None:
    add_old_days(20)
    task_id = id_made_at(timezone.now() - timedelta(days=5))
    statement = dialect_for(connection).select_result_sql(RESULT_COLUMNS, pruned=True)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + statement, [task_id, "default", finished_not_before(task_id)])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert planned_leaves(plan) == expected_leaves(task_id), plan


@pytest.mark.django_db(transaction=True)  # the async read is on a connection of its own
@pytest.mark.parametrize(
    ("task_id", "finished_days_ago"),
    [(new_task_id(), None), (new_task_id(), 0), (uuid.uuid4(), 0)],
    ids=["live", "finished", "uuid4"],
)
def test_aget_result_finds_the_task(task_id: uuid.UUID, finished_days_ago: float | None) -> None:
    if finished_days_ago is None:
        task = task_row(TaskResultStatus.READY, id=task_id)
    else:
        task = finished(finished_days_ago, task_id=task_id)
    result = async_to_sync(task_backends["default"].aget_result)(str(task.pk))
    assert result.status == task.status


def test_the_clock_skew_allowed_is_a_day() -> None:
    assert timedelta(days=1) == ID_CLOCK_SKEW
    now = timezone.now()
    earliest = finished_not_before(id_made_at(now))
    assert earliest is not None
    assert abs(earliest - (now - ID_CLOCK_SKEW)) < timedelta(milliseconds=2)
