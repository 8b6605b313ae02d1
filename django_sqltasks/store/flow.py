"""Flow control from outside the worker: pausing and resuming queues, running a deferred task
now. Every worker reads the paused queues in its claim statement, so a pause holds on every
machine from its commit on."""

from __future__ import annotations

import uuid
from collections.abc import Collection

from django.db import connections, transaction

from ..compat import TaskResultDoesNotExist, TaskResultStatus
from ..core.columns import MAX_NAME_LENGTH
from ..exceptions import UnknownQueue
from ..models import PausedQueue, TaskRecord
from ..sql import dialect_for
from ..sql.rows import parked_at


def check_queue(alias: str, known: Collection[str], queue_name: object) -> str:
    """Return ``queue_name`` if it can name a queue of the backend ``alias``; raise
    ``UnknownQueue`` naming the rule (and the backend's QUEUES, when it has any)."""

    if not isinstance(queue_name, str) or not 0 < len(queue_name) <= MAX_NAME_LENGTH:
        raise UnknownQueue(
            f"A queue name must be a string of 1 to {MAX_NAME_LENGTH} characters, not "
            f"{queue_name!r}."
        )
    if known and queue_name not in known:
        raise UnknownQueue(
            f"{queue_name!r} is not a queue of backend {alias!r}, whose QUEUES are: "
            f"{', '.join(sorted(known))}."
        )
    return queue_name


def pause(using: str, alias: str, queue_name: str) -> bool:
    """Stop workers claiming tasks of ``queue_name``; return False if it was paused already."""
    _, created = PausedQueue.objects.using(using).get_or_create(
        backend_name=alias, queue_name=queue_name
    )
    return created


def resume(using: str, alias: str, queue_name: str, announce: bool) -> bool:
    """Let workers claim tasks of ``queue_name`` again; return False if it was not paused.
    With ``announce``, wake the workers at once where the database can (PostgreSQL)."""
    with transaction.atomic(using=using):
        deleted, _ = (
            PausedQueue.objects.using(using)
            .filter(backend_name=alias, queue_name=queue_name)
            .delete()
        )
        if deleted and announce:
            with connections[using].cursor() as cursor:
                dialect_for(connections[using]).announce(cursor, [queue_name])
    return bool(deleted)


def run_now(using: str, alias: str, result_id: str, announce: bool) -> bool:
    """Make the deferred READY task ``result_id`` due now (by the database's clock); return
    False if it is not READY. Raise ``TaskResultDoesNotExist`` for an unknown id."""
    try:
        task_id = uuid.UUID(str(result_id))
    except ValueError as e:
        raise TaskResultDoesNotExist(result_id) from e
    connection = connections[using]
    dialect = dialect_for(connection)
    with transaction.atomic(using=using), connection.cursor() as cursor:
        if dialect.make_due(cursor, backend_name=alias, task_id=task_id):
            if announce:
                queue = TaskRecord.objects.using(using).get(pk=task_id).queue_name
                dialect.announce(cursor, [queue])
            return True
    row = (
        TaskRecord.objects.using(using)
        .filter(pk=task_id, backend_name=alias)
        .values_list("status", "available_at")
        .first()
    )
    if row is None:
        raise TaskResultDoesNotExist(result_id)
    status, available_at = row
    # Due already; a workflow step waiting for the steps before it is not made due.
    return status == TaskResultStatus.READY and available_at < parked_at()


def paused(using: str, alias: str) -> list[str]:
    """The paused queues of the backend ``alias``, by name."""
    rows = PausedQueue.objects.using(using).filter(backend_name=alias).order_by("queue_name")
    return list(rows.values_list("queue_name", flat=True))
