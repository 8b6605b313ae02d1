"""Atomic tasks (``@task(atomic=True)``): the task's body and the write of its outcome share
one transaction on the backend's database, so the task's own database writes commit with its
SUCCESSFUL mark or not at all. A worker killed mid-task leaves neither (the server rolls the
transaction back with the connection), and the rescue runs the task again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction

from . import attempt as attempts
from .completer import Completer

logger = logging.getLogger("django_sqltasks")


def run_atomic(
    completer: Completer,
    attempt: attempts.Attempt,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    max_bytes: int | None,
    exit_if_forked: Callable[[], None],
) -> bool:
    """Run ``attempt`` on this task thread and store its success in the same transaction;
    return whether its timeout fired first (then its slot was freed already). If the task is
    no longer this worker's, its transaction is rolled back. A task that raises is rolled back,
    and the caller records the failure as for any task."""
    database = completer.database
    # The transaction lasts as long as the task: it holds this thread's connection and the
    # task's row locks until then. That is the price of the guarantee (docs/workflows.md).
    with transaction.atomic(using=database):
        returned = attempt.task.func(*args, **kwargs)
        exit_if_forked()
        outcome, value = attempts.success(attempt.row.id, returned, max_bytes)
        outcome.workflow_id = attempt.row.workflow_id
        # The outcome's UPDATE locks the task's row until the commit: a timeout's failure,
        # written meanwhile by the completer, waits for it and then finds the task finished.
        stored = completer.store_here(outcome)
        if not stored:
            # Rescued, or failed by its timeout, meanwhile: its effects are not to be kept.
            transaction.set_rollback(True, using=database)
            logger.warning(
                "Task id=%s was no longer held by this worker when it ended; its transaction "
                "was rolled back",
                attempt.result.id,
                extra={"task_id": attempt.result.id},
            )
    late = attempt.policy.timeout is not None and not attempt.settle()
    if stored:
        completer.stored_elsewhere(outcome, (attempt, None, value))
    return late
