"""Atomic tasks (``@task(atomic=True)``): the task's body and the write of its outcome share
one transaction on the backend's database, so the task's own database writes commit with its
SUCCESSFUL mark or not at all. A worker killed mid-task leaves neither (the server rolls the
transaction back with the connection), and the rescue runs the task again.

On SQLite the transaction starts with ``BEGIN IMMEDIATE``: it takes the database's only write
lock before the task runs, waiting for it (the connection's busy timeout, then retried as any
"database is locked"). A deferred transaction would take it at its first write, and SQLite
refuses that at once, without waiting, when another transaction has written since this one
first read: tasks of the pattern in docs/workflows.md (read the row, then write it) would fail
with "database is locked" whenever two ran at once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from django.db import connections, transaction

from ..sql import dialect_for
from ..sql.retries import run_with_retries
from .attempt import Attempt
from .completer import Completer
from .outcomes import succeeded

logger = logging.getLogger("django_sqltasks")


def run_atomic(
    completer: Completer,
    attempt: Attempt,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    max_bytes: int | None,
    exit_if_forked: Callable[[], None],
) -> bool:
    """Run ``attempt`` on this task thread and write its success in the same transaction (the
    completer reports it once committed); return whether its timeout fired first (then its
    slot was freed already, and its transaction is rolled back). If the task is no longer this
    worker's, its transaction is rolled back. A task that raises is rolled back, and the caller
    records the failure as for any task."""
    database = completer.database
    timeout = attempt.policy.timeout
    # The transaction lasts as long as the task: it holds this thread's connection and the
    # task's row locks (on SQLite, the write lock) until then. That is the price of the
    # guarantee (docs/workflows.md).
    with contextlib.ExitStack() as stack:
        _begin(stack, database, attempt)
        if attempt.settled:
            return True  # its timeout fired while it waited for SQLite's write lock: not run
        returned = attempt.task.func(*args, **kwargs)
        exit_if_forked()
        ended = succeeded(attempt, returned, max_bytes)
        if timeout is not None and not attempt.settle():
            # Failed by its timeout meanwhile (the TaskTimeout is stored, or about to be: on
            # SQLite it waits for this transaction's write lock): its effects are not kept.
            transaction.set_rollback(True, using=database)
            return True
        # The outcome's UPDATE locks the task's row until the commit: a rescue written
        # meanwhile by another worker waits for it and then finds the task finished.
        if not completer.write_here(ended):
            # Rescued meanwhile: its effects are not to be kept.
            transaction.set_rollback(True, using=database)
            logger.warning(
                "Task id=%s was no longer held by this worker when it ended; its transaction "
                "was rolled back",
                attempt.result.id,
                extra={"task_id": attempt.result.id},
            )
    return False


def _begin(stack: contextlib.ExitStack, database: str, attempt: Attempt) -> None:
    """Open the task's transaction on ``stack``; on SQLite, wait for the write lock first (not
    if the task's timeout fires meanwhile)."""
    connection = connections[database]
    if not dialect_for(connection).single_writer:
        stack.enter_context(transaction.atomic(using=database))
        return

    sqlite: Any = connection  # django-stubs lack its transaction_mode (Django 5.1+)

    def begin() -> None:
        if attempt.settled:
            return
        sqlite.ensure_connection()  # connecting sets transaction_mode from the settings
        mode = sqlite.transaction_mode
        sqlite.transaction_mode = "EXCLUSIVE" if mode == "EXCLUSIVE" else "IMMEDIATE"
        try:
            stack.enter_context(transaction.atomic(using=database))
        finally:
            sqlite.transaction_mode = mode

    run_with_retries(database, begin)
