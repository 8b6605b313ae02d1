"""Writing new task rows on the caller's connection: one INSERT (or COPY, or packet-sized
INSERTs on MySQL) that joins the caller's transaction, the subject's UPDATE beside it, and
what follows a write (waking this process's workers, ``task_enqueued``)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any

from django.db import connections, transaction

from ..compat import Task, TaskResult, task_enqueued
from ..core.subject import subject_of_task
from ..sql import NewTask, dialect_for, installation, packet
from .wakeup import has_local_listeners, notify_local


def write_or_defer(
    database: str,
    on_commit: bool | str,
    rows: list[NewTask],
    results: list[TaskResult],
    *,
    notify: bool,
    sender: type,
) -> None:
    """``write`` now, or at the commit of the caller's transaction (ENQUEUE_ON_COMMIT)."""
    if on_commit:
        alias = database if on_commit is True else on_commit
        if connections[alias].in_atomic_block:
            later = partial(write, database, rows, results, notify=notify, sender=sender)
            transaction.on_commit(later, using=alias)
            return
    write(database, rows, results, notify=notify, sender=sender)


def write(
    database: str,
    rows: list[NewTask],
    results: list[TaskResult],
    *,
    notify: bool,
    sender: type,
) -> None:
    """Insert ``rows`` (one task's calls) in as few statements as the database allows."""
    task = results[0].task
    with installation.explain_missing_tables(database), with_subject(database, task):
        insert(database, rows, notify=notify)
        store_subject(database, rows, task)
    after_write(database, sender, rows, results)


def insert(database: str, rows: Sequence[NewTask], *, notify: bool) -> None:
    """Insert ``rows`` in as few statements as the database allows (one, COPY on PostgreSQL,
    or packet-sized INSERTs on MySQL), on the caller's connection and transaction."""
    connection = connections[database]
    dialect = dialect_for(connection)
    limit = packet.max_allowed_packet(connection)
    with connection.cursor() as cursor:
        if len(rows) == 1:
            dialect.insert(cursor, rows, notify=notify)
        elif limit is None:
            dialect.bulk_insert(cursor, rows, notify=notify)
        else:  # MySQL: each INSERT must fit in one packet
            for run in packet.statements(rows, limit):
                dialect.bulk_insert(cursor, run, notify=notify)


def insert_deduplicated(
    database: str, row: NewTask, result: TaskResult, *, notify: bool, sender: type
) -> str | None:
    """Insert ``row`` unless a live task holds its dedupe key: None if it was inserted, else
    the holder's id; "" if the holder finished between the two statements (try again)."""
    assert row.dedupe_key is not None
    connection = connections[database]
    dialect = dialect_for(connection)
    with (
        installation.explain_missing_tables(database),
        with_subject(database, result.task),
        connection.cursor() as cursor,
    ):
        if dialect.insert_deduplicated(cursor, row, notify=notify):
            store_subject(database, [row], result.task)
            after_write(database, sender, [row], [result])
            return None
        existing = dialect.live_task_with_key(cursor, row.dedupe_key)
    return "" if existing is None else str(existing)


def with_subject(database: str, task: Task) -> AbstractContextManager[Any]:
    """One transaction for the INSERT and the subject's UPDATE, for a task with a subject
    (others are one statement, and pay no transaction)."""
    if subject_of_task(task) is None:
        return nullcontext()
    return transaction.atomic(using=database)


def store_subject(database: str, rows: Sequence[NewTask], task: Task) -> None:
    """Record the subject of ``task`` on its new ``rows``, in the caller's transaction."""
    subject = subject_of_task(task)
    if subject is not None:
        # App registry: the backend, and so this module, loads before apps are ready.
        from ..models import TaskRecord

        TaskRecord.objects.using(database).filter(id__in=[r.id for r in rows]).update(
            subject_type=subject.type, subject_id=subject.id
        )


def after_write(
    database: str, sender: type, rows: Sequence[NewTask], results: Sequence[TaskResult]
) -> None:
    """Wake this process's idle workers of the rows' queues at commit; send task_enqueued."""
    if has_local_listeners(database):
        queues = sorted({row.queue_name for row in rows})
        for queue_name in queues:
            transaction.on_commit(
                partial(notify_local, database, queue_name), using=database, robust=True
            )
    for result in results:
        task_enqueued.send(sender, task_result=result)
