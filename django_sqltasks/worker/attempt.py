"""One attempt at a claimed task: its resolved task and ``TaskResult``, and its outcome as it
will be stored (every stored value made storable first)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import traceback
from dataclasses import dataclass, field
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from ..compat import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
from ..core.bounds import MAX_DELAY
from ..core.progress import AttemptReport, ReportSink, SQLTaskContext
from ..core.resolve import errors_from_json, rebind_task, resolve_task
from ..core.serialization import check_json, dumps
from ..core.storable import storable_class_path, storable_traceback
from ..exceptions import (
    CorruptTask,
    InvalidReturnValue,
    InvalidTaskArguments,
    PayloadTooLarge,
    SnoozeLimitReached,
)
from ..sql import ClaimedRow, Outcome
from ..task import Policy, policy_for

if TYPE_CHECKING:
    from ..core.options import BackendOptions

try:
    from django.utils.json import normalize_json
except ImportError:  # pragma: no cover - Django 5.2 with the backport
    from django_tasks.utils import normalize_json  # type: ignore[no-redef]


logger = logging.getLogger("django_sqltasks")

# Frames a task's traceback starts with that are ours or asyncio's, not the task's own.
_RUNNER_DIRS = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep,
)
_settle_lock = threading.Lock()
# (task, id(options)) -> (options, policy): the options are held, so their id is not reused.
_policies: dict[tuple[Task, int], tuple[BackendOptions, Policy]] = {}
MAX_POLICIES = 4096  # distinct (task, options) pairs cached; the cache restarts beyond


@dataclass(slots=True)
class Attempt:
    """A claimed task ready to run: its row, its resolved Task and its TaskResult."""

    row: ClaimedRow
    task: Task
    result: TaskResult
    policy: Policy
    settled: bool = field(default=False)
    # What the task reports through its context (takes_context=True tasks only).
    report: AttemptReport | None = None

    def settle(self) -> bool:
        """Return True to the first caller only: the task ending, or its timeout firing."""
        with _settle_lock:
            if self.settled:
                return False
            self.settled = True
            return True

    def call_args(
        self, reports: ReportSink | None = None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The function's arguments; a context first for ``takes_context`` tasks, whose
        reports go to ``reports``."""
        args: tuple[Any, ...] = tuple(self.result.args)
        if self.task.takes_context:
            row = self.row
            self.report = AttemptReport(
                row.id,
                len(row.worker_ids),
                reports,
                claims=row.attempts,
                labels=(row.backend_name, row.queue_name, row.task_path),
            )
            context: TaskContext = SQLTaskContext(task_result=self.result, report=self.report)
            args = (context, *args)
        return args, self.result.kwargs


def is_async(task: Task) -> bool:
    """Whether ``task`` is an ``async def`` function, to run on the event loop."""
    return iscoroutinefunction(task.func)


def prepare(row: ClaimedRow, config: BackendOptions) -> Attempt:
    """Resolve the row's task and build its RUNNING ``TaskResult``; raise ``TaskNotFound``
    or ``CorruptTask``."""
    if row.corrupt is not None:
        raise CorruptTask(f"The stored task cannot be run: {row.corrupt}.")
    task = rebind_task(
        resolve_task(row.task_path),
        priority=row.priority,
        queue_name=row.queue_name,
        run_after=row.run_after,
        backend=row.backend_name,
    )
    result: TaskResult = TaskResult(
        task=task,
        id=str(row.id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=row.enqueued_at,
        started_at=row.started_at,
        finished_at=None,
        last_attempted_at=row.last_attempted_at,
        args=[],
        kwargs={},
        backend=row.backend_name,
        errors=errors_from_json(row.errors),
        worker_ids=row.worker_ids,
    )
    # Decoded from JSON, the arguments are normalized already: TaskResult would walk them
    # again (normalize_json) if they were passed to it.
    object.__setattr__(result, "args", row.args)
    object.__setattr__(result, "kwargs", row.kwargs)
    return Attempt(row=row, task=task, result=result, policy=_policy(task, config))


def _policy(task: Task, config: BackendOptions) -> Policy:
    """``policy_for``, computed once per task and options."""
    key = (task, id(config))
    try:
        cached = _policies.get(key)
    except TypeError:  # a task with an unhashable option
        return policy_for(task, config)
    if cached is not None and cached[0] is config:
        return cached[1]
    if len(_policies) >= MAX_POLICIES:
        _policies.clear()
    policy = policy_for(task, config)
    _policies[key] = (config, policy)
    return policy


def success(
    attempt_id: Any, raw_return_value: Any, max_bytes: int | None = None
) -> tuple[Outcome, Any]:
    """Normalize and check a return value; raise ``InvalidReturnValue`` if it is not JSON
    and ``PayloadTooLarge`` if it encodes to more than ``max_bytes``."""
    try:
        check_json(raw_return_value, "Task return value")
    except InvalidTaskArguments as e:
        raise InvalidReturnValue(str(e)) from None
    value = normalize_json(raw_return_value)
    encoded = None if value is None else dumps(value)
    if encoded is not None and max_bytes is not None and len(encoded) > max_bytes:
        raise PayloadTooLarge(
            f"Task return value encodes to {len(encoded)} bytes, over the MAX_PAYLOAD_BYTES "
            f"limit of {max_bytes}: store large results elsewhere and return their key."
        )
    outcome = Outcome(
        id=attempt_id,
        status=TaskResultStatus.SUCCESSFUL,
        finished_at=timezone.now(),
        return_value=encoded,
    )
    return outcome, value


def from_task_frame(exc: BaseException) -> BaseException:
    """``exc`` with the worker's own frames taken off the start of its traceback, so that it
    starts at the task's frame (where the task raised; a worker error keeps its frames)."""
    tb = exc.__traceback__
    first = tb
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_RUNNER_DIRS):
        tb = tb.tb_next
    if tb is not None and tb is not first:
        exc.__traceback__ = tb
    return exc


def failure(attempt_id: Any, exc: BaseException) -> Outcome:
    """Record ``exc`` as the attempt's error, with its class path and traceback, both made
    storable (escaped and capped: see ``storable``)."""
    kind = type(exc)
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception as e:  # an exception whose __str__ raises, say
        text = f"{kind.__qualname__}: (its message could not be formatted: {e!r})"
    return Outcome(
        id=attempt_id,
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


def retry(attempt_id: Any, exc: BaseException, delay: float) -> Outcome:
    """Record ``exc`` and put the task back to READY, to run again ``delay`` seconds after the
    outcome is written, by the database's clock."""
    outcome = failure(attempt_id, exc)
    outcome.status = TaskResultStatus.READY
    outcome.finished_at = None
    outcome.delay = _bounded(delay)
    return outcome


def snooze(attempt_id: Any, delay: float) -> Outcome:
    """Put the task back to READY, to run again ``delay`` seconds after the outcome is
    written (by the database's clock), with no error recorded: the write gives its attempt
    back and counts a snooze instead."""
    return Outcome(
        id=attempt_id,
        status=TaskResultStatus.READY,
        finished_at=None,
        return_value=None,
        delay=_bounded(delay),
        snoozed=1,
    )


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
