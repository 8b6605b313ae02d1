"""How an attempt ends: the outcome it writes, the write, and the report once it is stored.

The worker and ``run_tasks`` both go through here, so they cannot drift: a return value becomes
a success (checked and encoded), an error a snooze, a retry or a failure (``after_error``), a
step's final outcome carries its workflow (``_ended``, the one place that sets it),
``write_outcomes`` stores outcomes and moves their workflows on in the same transaction, and
``report`` updates the in-memory result and sends ``task_finished``.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from ..compat import TaskError, TaskResult, TaskResultStatus, logs_task_finished, task_finished
from ..core.binding import add_context_hint
from ..core.bounds import MAX_DELAY
from ..core.policy import Policy
from ..core.serialization import check_json, dumps, normalized
from ..core.storable import storable_class_path, storable_traceback
from ..exceptions import (
    InvalidReturnValue,
    InvalidTaskArguments,
    PayloadTooLarge,
    Snooze,
    SnoozeLimitReached,
    Suspended,
)
from ..sql import ClaimedRow, Dialect, Outcome
from ..store import workflows
from .attempt import Attempt
from .receivers import Receivers

logger = logging.getLogger("django_sqltasks")


@dataclass(slots=True)
class Ended:
    """An attempt's end, from the thread that ran it to the database and back: the outcome to
    write, and what its report needs once the outcome is stored. Made by one thread and handed
    over whole (to the completer, then the signal thread); never changed after."""

    outcome: Outcome
    attempt: Attempt | None = None  # None: the task never started, and nothing is reported
    error: BaseException | None = None  # what the task raised (task_finished's receivers see it)
    value: Any = None  # the return value as stored (normalized JSON)


# Making outcomes -------------------------------------------------------------------------------


def _ended(
    row: ClaimedRow,
    outcome: Outcome,
    attempt: Attempt | None = None,
    error: BaseException | None = None,
    value: Any = None,
) -> Ended:
    """``outcome`` of ``row``'s task; a final one names the row's workflow, if it is a step of
    one, so that storing it moves the workflow on (``write_outcomes``)."""
    _of_claim(row, outcome)
    if outcome.status != TaskResultStatus.READY:
        outcome.workflow_id = row.workflow_id
    return Ended(outcome, attempt, error, value)


def succeeded(attempt: Attempt, returned: Any, max_bytes: int | None = None) -> Ended:
    """The success of ``attempt``, which returned ``returned``; raise ``InvalidReturnValue``
    if that is not JSON and ``PayloadTooLarge`` if it encodes to more than ``max_bytes``."""
    try:
        check_json(returned, "Task return value")
    except InvalidTaskArguments as e:
        raise InvalidReturnValue(str(e)) from None
    value = normalized(returned)
    encoded = None if value is None else dumps(value)
    if encoded is not None and max_bytes is not None and len(encoded) > max_bytes:
        raise PayloadTooLarge(
            f"Task return value encodes to {len(encoded)} bytes, over the MAX_PAYLOAD_BYTES "
            f"limit of {max_bytes}: store large results elsewhere and return their key."
        )
    outcome = Outcome(
        id=attempt.row.id,
        status=TaskResultStatus.SUCCESSFUL,
        finished_at=timezone.now(),
        return_value=encoded,
    )
    return _ended(attempt.row, outcome, attempt, value=value)


def unstarted(row: ClaimedRow, exc: BaseException) -> Ended:
    """The failure of a claimed task that does not start: it cannot run (``TaskNotFound``,
    ``CorruptTask``), or was cancelled while it waited for a slot. Nothing is reported."""
    return _ended(row, failure(row.id, exc))


def after_error(attempt: Attempt, exc: BaseException, max_snoozes: int) -> Ended:
    """What ``attempt``, which raised ``exc``, writes: a snooze while the task has snoozed
    fewer than ``max_snoozes`` times, a retry while its policy allows one, else a failure. A
    Snooze past the limit fails as ``SnoozeLimitReached``, which is never retried."""
    row = attempt.row
    add_context_hint(attempt.task, exc)
    if isinstance(exc, Snooze):
        if row.snoozes < max_snoozes:
            return Ended(_of_claim(row, _snooze(row.id, exc.seconds)), attempt, exc)
        exc = snooze_limit_reached(exc, row.snoozes, max_snoozes)
    delay = retry_delay(attempt.policy, row.attempts, exc)
    if delay is not None:
        return Ended(_of_claim(row, _retry(row.id, exc, delay)), attempt, exc)
    return _ended(row, failure(row.id, exc), attempt, exc)


def _of_claim(row: ClaimedRow, outcome: Outcome) -> Outcome:
    """``outcome``, to be stored only over the claim of ``row`` (its attempt number), not over
    a later claim of the same task under the same worker id."""
    outcome.attempt = row.attempts
    return outcome


def failure(task_id: uuid.UUID, exc: BaseException) -> Outcome:
    """Record ``exc`` as the attempt's error, with its class path and traceback, both made
    storable (escaped and capped: see ``storable``)."""
    kind = type(exc)
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception as e:  # an exception whose __str__ raises, say
        text = f"{kind.__qualname__}: (its message could not be formatted: {e!r})"
    return Outcome(
        id=task_id,
        status=TaskResultStatus.FAILED,
        finished_at=timezone.now(),
        return_value=None,
        error_class=storable_class_path(f"{kind.__module__}.{kind.__qualname__}"),
        error_traceback=storable_traceback(text),
    )


def snooze_limit_reached(snooze: BaseException, snoozes: int, most: int) -> SnoozeLimitReached:
    """The error of a task that raised ``snooze`` after ``snoozes`` snoozes, MAX_SNOOZES
    being ``most``: it fails, with the Snooze as its cause."""
    over = SnoozeLimitReached(
        f"The task raised Snooze after snoozing {snoozes} time(s) (MAX_SNOOZES is {most}), so "
        "it failed; it is not retried."
    )
    over.__cause__, over.__traceback__ = snooze, snooze.__traceback__
    return over


def retry_delay(policy: Policy, attempt: int, exc: BaseException) -> float | None:
    """Seconds before the task runs again after ``exc`` ended its attempt number ``attempt``,
    or None if it is not retried. A policy that cannot say (built past validation) is logged
    and the task fails: it never stays RUNNING for want of a number."""
    try:
        return policy.delay(attempt) if policy.should_retry(attempt, exc) else None
    except Exception:
        logger.exception(
            "The retry policy of attempt %d cannot be applied (retry_on %r, backoff %r, "
            "backoff_max %r): the task fails instead of being retried",
            attempt,
            policy.retry_on,
            policy.backoff,
            policy.backoff_max,
        )
        return None


def _bounded(delay: float) -> float:
    """``delay`` as seconds the database can add to its clock: from 0 to MAX_DELAY."""
    if delay != delay:  # NaN
        return 0.0
    return min(max(float(delay), 0.0), MAX_DELAY)


def _retry(task_id: uuid.UUID, exc: BaseException, delay: float) -> Outcome:
    """Record ``exc`` and put the task back to READY, to run again ``delay`` seconds after the
    outcome is written, by the database's clock."""
    outcome = failure(task_id, exc)
    outcome.status = TaskResultStatus.READY
    outcome.finished_at = None
    outcome.delay = _bounded(delay)
    return outcome


def _snooze(task_id: uuid.UUID, delay: float) -> Outcome:
    """Put the task back to READY, to run again ``delay`` seconds after the outcome is
    written (by the database's clock), with no error recorded: the write gives its attempt
    back and counts a snooze instead."""
    return Outcome(
        id=task_id,
        status=TaskResultStatus.READY,
        finished_at=None,
        return_value=None,
        delay=_bounded(delay),
        snoozed=1,
    )


def log(ended: Ended, max_snoozes: int, sender: type) -> None:
    """Log how a worker's attempt ended (a failure only when Django Tasks' own receiver of
    ``task_finished`` does not log it once stored: one record per failure, not two)."""
    attempt, outcome = ended.attempt, ended.outcome
    assert attempt is not None
    if outcome.status == TaskResultStatus.SUCCESSFUL and not logger.isEnabledFor(logging.DEBUG):
        return  # the common case, before building the path (a new string each time)
    task_id, path, number = attempt.result.id, attempt.task.module_path, attempt.row.attempts
    if outcome.status == TaskResultStatus.SUCCESSFUL:
        logger.debug(
            "Task id=%s path=%s state=SUCCESSFUL attempt=%d",
            task_id,
            path,
            number,
            extra={"action": "task_successful", "task_id": task_id},
        )
    elif outcome.snoozed:
        assert isinstance(ended.error, Snooze)
        logger.info(
            "Task id=%s path=%s snoozed for %.1fs (snooze %d of at most %d)",
            task_id,
            path,
            ended.error.seconds,
            attempt.row.snoozes + 1,
            max_snoozes,
            extra={"action": "task_snoozed", "task_id": task_id},
        )
    elif outcome.status == TaskResultStatus.READY:
        logger.warning(
            "Task id=%s path=%s failed on attempt %d of %d; retrying in %.1fs",
            task_id,
            path,
            number,
            attempt.policy.max_attempts,
            outcome.delay,
            exc_info=ended.error,
            extra={"action": "task_retry", "task_id": task_id},
        )
    elif not Receivers(task_finished, sender).includes(logs_task_finished):
        logger.error(
            "Task id=%s path=%s state=%s attempt=%d",
            task_id,
            path,
            TaskResultStatus.FAILED,
            number,
            exc_info=ended.error,
            extra={"action": "task_failed", "task_id": task_id},
        )


def log_suspended(attempt: Attempt, suspended: Suspended) -> None:
    """Log an attempt that stopped at a sleep or a wait (``Suspended``): its task is READY
    again, written by the task's own thread, and nothing more is written or reported."""
    logger.info(
        "Task id=%s path=%s stopped, %s",
        attempt.result.id,
        attempt.task.module_path,
        suspended.reason,
        extra={"action": "task_suspended", "task_id": attempt.result.id},
    )


# Writing and reporting -------------------------------------------------------------------------


def write_outcomes(
    database: str,
    worker_id: str,
    dialect: Dialect,
    cursor: CursorWrapper,
    outcomes: Sequence[Outcome],
) -> set[uuid.UUID]:
    """Store ``outcomes`` of tasks that ``worker_id`` holds; a workflow step's final outcome
    moves its workflow on, in the same transaction. Return the ids stored."""
    store = partial(dialect.complete, cursor, worker_id, outcomes)
    if all(o.workflow_id is None for o in outcomes):
        return store()
    return workflows.complete(database, outcomes, store)


def report(ended: Ended, stored: Outcome, receivers: Receivers) -> None:
    """Update the attempt's result to ``stored`` (``ended.outcome``, or what was stored in its
    place) and, once the task has finished, send ``task_finished`` through ``receivers``
    while the error it raised is the one being handled (receivers read ``sys.exc_info()``)."""
    attempt = ended.attempt
    if attempt is None:
        return
    apply(attempt.result, stored, ended.value)
    if stored.status == TaskResultStatus.READY:
        return  # retried or snoozed: not finished yet
    exc = ended.error
    if exc is None:
        receivers.send_for(attempt.result)
        return
    tb = exc.__traceback__
    try:
        raise exc
    except BaseException:
        # With the traceback it was stored with: from the task's own frame, without this one.
        exc.__traceback__ = tb
        receivers.send_for(attempt.result)


def apply(result: TaskResult, outcome: Outcome, return_value: Any = None) -> None:
    """Copy ``outcome`` onto the in-memory ``result``, as the database now holds it."""
    object.__setattr__(result, "status", TaskResultStatus(outcome.status))
    object.__setattr__(result, "finished_at", outcome.finished_at)
    if outcome.error_class is not None:
        result.errors.append(
            TaskError(
                exception_class_path=outcome.error_class,
                traceback=outcome.error_traceback or "",
            )
        )
    elif outcome.status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", return_value)
