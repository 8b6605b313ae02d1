"""Operator controls on stored tasks: retry failed ones, cancel ones not started, delete finished.

Each change is one guarded UPDATE or DELETE per task, conditioned on the status (and, where the
errors list is rewritten, the attempt count) read just before, so a task that a worker claims or
finishes in between is left alone rather than overwritten. On PostgreSQL's partitioned table a
task that finishes meanwhile has moved partition: the change is run again (``moved.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from functools import partial
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from ..compat import TaskResultDoesNotExist, TaskResultStatus
from ..models import TaskRecord
from ..sql import dialect_for
from .moved import rerun_if_moved
from .partitions import partitioned_recently

CANCELLED = "django_sqltasks.exceptions.TaskCancelled"


def database_now(using: str) -> datetime:
    """The database's time, which decides when tasks run and which workers are live: the
    operator's machine may have a clock of its own."""
    connection = connections[using]
    with connection.cursor() as cursor:
        return dialect_for(connection).db_now(cursor)


def retried_columns(now: datetime) -> dict[str, Any]:
    """The columns a retry sets: READY, due ``now``, its last outcome cleared."""
    return {
        "status": TaskResultStatus.READY,
        "available_at": now,
        "finished_at": None,
        "return_value": None,
        "owner": None,
    }


def retry(tasks: Iterable[TaskRecord], using: str) -> list[TaskRecord]:
    """Put FAILED tasks back to READY, keeping their errors, worker ids and attempt count.

    The task keeps its id, so code holding its ``TaskResult`` sees the new attempt, and its
    history stays on one row. Return the tasks that were retried.
    """
    now = database_now(using)  # due now by the clock the claim reads
    retried = []
    for record in tasks:

        def retry_one(record: TaskRecord = record) -> int:
            with transaction.atomic(using=using):
                return (
                    TaskRecord.objects.using(using)
                    .filter(pk=record.pk, status=TaskResultStatus.FAILED)
                    .update(**retried_columns(now))
                )

        try:
            changed = rerun_if_moved(using, retry_one)
        except IntegrityError:
            # A newer live task holds this task's dedupe key: that one will do the work.
            continue
        if changed:
            retried.append(record)
    return retried


def cancel(tasks: Iterable[TaskRecord], using: str, reason: str) -> list[TaskRecord]:
    """Mark READY tasks FAILED with a ``TaskCancelled`` error; return the tasks cancelled.

    A task claimed meanwhile is RUNNING, or has a higher attempt count, and is not touched.
    """
    now = timezone.now()
    cancelled = []
    for record in tasks:

        def cancel_one(record: TaskRecord = record) -> int:
            with transaction.atomic(using=using):
                # Lock the row, if still READY, so a claim (SKIP LOCKED) passes it by meanwhile.
                current = (
                    TaskRecord.objects.using(using)
                    .select_for_update(skip_locked=True)
                    .filter(pk=record.pk, status=TaskResultStatus.READY)
                    .only("errors", "attempts")
                    .first()
                )
                if current is None:
                    return 0
                errors = [
                    *current.errors,
                    {"exception_class_path": CANCELLED, "traceback": reason},
                ]
                changed = (
                    TaskRecord.objects.using(using)
                    .filter(pk=record.pk, status=TaskResultStatus.READY, attempts=current.attempts)
                    .update(status=TaskResultStatus.FAILED, errors=errors, finished_at=now)
                )
                if changed:  # wake its waiters (result.wait()) at commit
                    connection = connections[using]
                    with connection.cursor() as cursor:
                        dialect_for(connection).announce_finished(cursor, [record.pk])
                return changed

        if rerun_if_moved(using, cancel_one):
            cancelled.append(record)
    return cancelled


def request_cancel(tasks: Iterable[TaskRecord], using: str) -> list[TaskRecord]:
    """Ask the workers of RUNNING tasks to cancel them; return the tasks asked.

    An async task is cancelled at its worker's next heartbeat and ends FAILED with a
    ``TaskCancelled`` error; a sync task cannot be interrupted and runs to its end.
    """
    asked = []
    for record in tasks:
        rows = TaskRecord.objects.using(using).filter(pk=record.pk, status=TaskResultStatus.RUNNING)
        # A task that finishes meanwhile moves partition: the rerun finds it no longer RUNNING.
        changed = rerun_if_moved(using, partial(rows.update, cancel_requested=True))
        if changed:
            asked.append(record)
    return asked


def cancel_by_id(database: str, alias: str, result_id: str) -> bool:
    """``SQLTaskBackend.cancel``: cancel a READY task, or ask a RUNNING one to stop; False if it
    had finished (or is a RUNNING sync task, flagged all the same). Raise
    ``TaskResultDoesNotExist`` for an unknown id."""
    try:
        task_uuid = uuid.UUID(str(result_id))
    except ValueError as e:
        raise TaskResultDoesNotExist(result_id) from e
    record = (
        TaskRecord.objects.using(database)
        .with_id(task_uuid, partitioned=partitioned_recently(database))
        .filter(backend_name=alias)
        .first()
    )
    if record is None:
        raise TaskResultDoesNotExist(result_id)
    if cancel([record], using=database, reason="Cancelled before it started."):
        return True
    return bool(request_cancel([record], using=database))
