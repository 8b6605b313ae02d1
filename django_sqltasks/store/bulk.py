"""Changes to a batch of tasks at once: retry, cancel or delete the rows of a list of ids, one
statement each, guarded by the status the change needs, so that a row claimed or finished
since its id was read is left as it is. ``TaskQuery`` (``query.py``) and the admin's job over
every task of a list (``admin/bulk_jobs.py``) make their changes through these.

``eligible`` says which tasks a change applies to, so that what an operator is told will
change is counted by the same rule as what then changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, OperationalError, connections, transaction
from django.db.models import Q
from django.utils import timezone

from ..compat import TaskResultStatus
from ..models import TaskRecord, TaskRecordQuerySet
from ..sql import dialect_for
from ..sql.expressions import AppendError
from . import control, steps
from .moved import TRIES, rerun_if_moved, was_moved

RETRY, CANCEL, DELETE = "retry", "cancel", "delete"
KINDS = (RETRY, CANCEL, DELETE)
CANCEL_REASON = "Cancelled by a task query."


def eligible(kind: str, tasks: TaskRecordQuerySet) -> TaskRecordQuerySet:
    """The tasks of ``tasks`` that change ``kind`` applies to."""
    if kind == RETRY:
        # Not a workflow step that never ran: it was written without the arguments the steps
        # before it hand on (retry the step that failed instead).
        return tasks.failed().exclude(workflow_id__isnull=False, attempts=0)
    if kind == CANCEL:
        # READY ones are cancelled; RUNNING ones not yet asked are asked to stop.
        return tasks.filter(
            Q(status=TaskResultStatus.READY)
            | Q(status=TaskResultStatus.RUNNING, cancel_requested=False)
        )
    if kind == DELETE:
        return tasks.finished()
    raise ValueError(f"kind: must be one of {', '.join(KINDS)}, not {kind!r}.")


def retry_batch(database: str, ids: list[Any]) -> int:
    """Put the FAILED tasks of ``ids`` back to READY, due now, keeping their errors and
    attempts; return how many. One whose dedupe key a newer live task holds stays FAILED."""
    tasks = records(database)
    now = control.database_now(database)  # due now by the clock the claim reads
    try:
        with transaction.atomic(using=database):  # a savepoint inside a caller's transaction
            return tasks.failed().filter(pk__in=ids).update(**control.retried_columns(now))
    except IntegrityError:
        # A newer live task holds the dedupe key of one of them: retry them one by one, so
        # that only that one stays FAILED.
        failed = tasks.failed().filter(pk__in=ids)
        return len(control.retry(list(failed.only("pk")), using=database))


def cancel_batch(database: str, ids: list[Any], reason: str = CANCEL_REASON) -> int:
    """Cancel the READY tasks of ``ids`` and ask the workers of the RUNNING ones to stop them
    (async tasks stop at their next heartbeat; sync ones run to their end); return how many."""
    return cancel_ready_batch(database, ids, reason) + stop_batch(database, ids)


def cancel_ready_batch(database: str, ids: list[Any], reason: str = CANCEL_REASON) -> int:
    """Mark the READY tasks of ``ids`` FAILED, with a ``TaskCancelled`` error carrying
    ``reason``; return how many."""
    tasks = records(database)
    entry = {"exception_class_path": control.CANCELLED, "traceback": reason}
    # The guard on status keeps any row claimed or finished meanwhile as it is.
    count = (
        tasks.ready()
        .filter(pk__in=ids)
        .update(
            status=TaskResultStatus.FAILED, errors=AppendError(entry), finished_at=timezone.now()
        )
    )
    connection = connections[database]
    with connection.cursor() as cursor:  # wake their waiters (result.wait()) at commit
        dialect_for(connection).announce_finished(cursor, ids)
    return count


def stop_batch(database: str, ids: list[Any]) -> int:
    """Ask the workers of the RUNNING tasks of ``ids`` to stop them; return how many."""
    return (
        records(database)
        .running()
        .filter(pk__in=ids, cancel_requested=False)
        .update(cancel_requested=True)
    )


def delete_batch(database: str, ids: list[Any]) -> int:
    """Delete the finished tasks of ``ids``, and their durable steps; return how many."""
    tasks = records(database)
    # A task retried meanwhile moved partition (PostgreSQL): delete again without it.
    count, _ = rerun_if_moved(database, tasks.finished().filter(pk__in=ids).delete)
    steps.forget(database, ids)
    return count


CHANGES: dict[str, Callable[[str, list[Any]], int]] = {
    RETRY: retry_batch,
    CANCEL: cancel_batch,
    DELETE: delete_batch,
}


def apply(kind: str, database: str, ids: list[Any], reason: str = CANCEL_REASON) -> int:
    """Make change ``kind`` to the tasks of ``ids``, inside the caller's transaction, in a
    savepoint run again while a row it waited for moved partition (PostgreSQL): the caller's
    transaction stays usable, and commits the change with whatever it records beside it."""
    for attempt in range(1, TRIES + 1):
        try:
            with transaction.atomic(using=database):
                if kind == CANCEL:
                    return cancel_batch(database, ids, reason)
                return CHANGES[kind](database, ids)
        except OperationalError as e:
            if not was_moved(e) or attempt == TRIES:
                raise
    raise AssertionError("unreachable")


def next_ids(tasks: TaskRecordQuerySet, below: Any, size: int) -> list[Any]:
    """The ids of the next batch of ``tasks``: at most ``size``, newest first, below the id
    ``below`` (keyset: each batch starts where the last ended, so none is read twice)."""
    rest = tasks.filter(pk__lt=below).order_by("-pk")
    return list(rest.values_list("pk", flat=True)[:size])


def records(database: str) -> TaskRecordQuerySet:
    """Every task of ``database``."""
    return TaskRecord.objects.using(database).all()
