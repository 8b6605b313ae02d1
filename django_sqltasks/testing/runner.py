"""Running due tasks in the test's own process, on the test's own connection and transaction.

The worker's own pieces do the work: the backend's claim statement (``Dialect.claim``), the
attempt (``worker.attempt``), and how it ends (``worker.outcomes``: the retry, snooze or
failure decision, the outcome write, which moves a workflow on, and the finished signal).
What differs from a worker is only where the function runs: on the calling thread, one task
at a time, so the task sees the rows the test made inside its transaction (a ``TestCase``,
or pytest-django's ``db``).
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connections, transaction
from django.db.models import F, Min
from django.utils import timezone

from ..compat import (
    DEFAULT_TASK_BACKEND_ALIAS,
    TaskResult,
    TaskResultStatus,
    task_backends,
    task_finished,
    task_started,
)
from ..core.articles import a_or_an
from ..core.backends import is_sql_backend
from ..exceptions import Suspended
from ..models import StepRecord, TaskRecord
from ..sql import ANY_LIMIT, ClaimedRow, Outcome, Scope, dialect_for
from ..sql.rows import parked_at
from ..worker import attempt as attempts
from ..worker import outcomes
from ..worker.receivers import Receivers
from ..worker.reporter import log_failure, store

DEFAULT_MAX_TASKS = 1000  # attempts one run_tasks() makes before it decides tasks loop for ever
# How far due rows are moved back for the claim. The claim compares available_at with the
# database's clock, which inside a test's transaction is the transaction's start on
# PostgreSQL: earlier than tasks enqueued since. Moved this far back, every row the test's
# clock says is due is due by any database clock; the rows are moved back after the claim.
CLAIM_SHIFT = timedelta(days=36500)


class RunawayTasks(AssertionError):
    """run_tasks() made ``max_tasks`` attempts and tasks were still due: most likely a task
    that enqueues itself, or one that is retried without end."""


def backend_for(alias: str) -> Any:
    """The SQLTaskBackend of ``alias``; raise ``TypeError`` naming the alias otherwise."""
    backend = task_backends[alias]
    if not is_sql_backend(backend):
        raise TypeError(
            f"Task backend {alias!r} is {a_or_an(type(backend).__name__)}, not a SQLTaskBackend: "
            "run_tasks() runs the tasks of django-sqltasks backends only."
        )
    return backend


def _ready(backend: Any, queues: list[str] | None) -> Any:
    return (
        TaskRecord.objects.using(backend.database)
        .for_backend(backend.alias)
        .in_queues(queues)
        .ready()
        .filter(available_at__lt=parked_at())  # a workflow's step waits for its turn, not a clock
    )


def advance(delta: timedelta | float, *, backend: str = DEFAULT_TASK_BACKEND_ALIAS) -> timedelta:
    """Move the queue's clock forward: every READY task of ``backend`` becomes due ``delta``
    (a timedelta, or seconds) sooner, as if that much time had passed. Return the delta.

    Only the queue's clock moves (each task's ``available_at``, and the wake time of a durable
    task's sleep or wait); ``timezone.now()`` does not.
    """
    if not isinstance(delta, timedelta):
        if isinstance(delta, bool) or not isinstance(delta, (int, float)):
            raise TypeError(f"delta must be a timedelta or a number of seconds, not {delta!r}.")
        delta = timedelta(seconds=delta)
    if delta < timedelta(0):
        raise ValueError(f"delta must not be negative (the clock only moves forward): {delta}.")
    ready = _ready(backend_for(backend), None)
    # A durable task's sleep or wait ends by its own wake time too (store/waits.py).
    StepRecord.objects.using(ready.db).filter(
        state=StepRecord.WAITING, wake_at__isnull=False, task_id__in=ready.values("pk")
    ).update(wake_at=F("wake_at") - delta)
    ready.update(available_at=F("available_at") - delta)
    return delta


def run_tasks(
    *,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    queues: list[str] | None = None,
    fast_forward: bool = False,
    max_tasks: int = DEFAULT_MAX_TASKS,
) -> list[TaskResult]:
    """Run every due task of ``backend`` in this process, the tasks they enqueue and the
    retries that come due included, until none is due; return each finished task's result.

    ``queues`` limits the run to those queues (all by default). With ``fast_forward``, when
    nothing is due, the queue's clock moves to the next READY task (a deferred task, a retry
    waiting out its backoff) and the run goes on until no READY task is left.
    """
    if isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or max_tasks < 1:
        raise ValueError(f"max_tasks must be a whole number of at least 1, not {max_tasks!r}.")
    runner = Runner(backend_for(backend), queues)
    finished: dict[str, TaskResult] = {}
    for _ in range(max_tasks):
        row = runner.claim()
        if row is None and fast_forward and runner.skip_to_next():
            row = runner.claim()
        if row is None:
            return list(finished.values())
        result = runner.run(row)
        if result.status == TaskResultStatus.READY:
            finished.pop(result.id, None)
        else:
            finished[result.id] = result
    if runner.claimable(fast_forward):
        raise RunawayTasks(
            f"run_tasks() made {max_tasks} attempts (max_tasks) and tasks are still due: a "
            "task that enqueues itself, or one retried without end? Raise max_tasks if not."
        )
    return list(finished.values())


class Runner:
    """Claim, run and record tasks one at a time on the calling thread's connection."""

    def __init__(self, backend: Any, queues: list[str] | None) -> None:
        self.backend = backend
        self.queues = None if queues is None or "*" in queues else list(queues)
        self.worker_id = f"test-{uuid.uuid4().hex[:12]}"
        self.sender = type(backend)

    @property
    def connection(self) -> Any:
        return connections[self.backend.database]

    def claimable(self, fast_forward: bool) -> bool:
        ready = _ready(self.backend, self.queues)
        return (ready if fast_forward else ready.filter(available_at__lte=timezone.now())).exists()

    def skip_to_next(self) -> bool:
        """Move the queue's clock to the next READY task; return False if there is none."""
        ready = _ready(self.backend, self.queues)
        earliest: datetime | None = ready.aggregate(at=Min("available_at"))["at"]
        if earliest is None:
            return False
        advance(max(earliest - timezone.now(), timedelta(0)), backend=self.backend.alias)
        return True

    def claim(self) -> ClaimedRow | None:
        """Claim the task a worker would claim next, if one is due by this process's clock."""
        now = timezone.now()
        due = _ready(self.backend, self.queues).filter(available_at__lte=now)
        with transaction.atomic(using=self.backend.database):
            if not due.update(available_at=F("available_at") - CLAIM_SHIFT):
                return None
            with self.connection.cursor() as cursor:
                rows = dialect_for(self.connection).claim(
                    cursor,
                    backend_name=self.backend.alias,
                    queue_names=self.queues,
                    worker_id=self.worker_id,
                    limit=1,
                    # One task at a time in the test's process: within any concurrency limit.
                    scope=Scope(limit_key=ANY_LIMIT),
                )
            self._unshift(now)
        return rows[0] if rows else None

    def _unshift(self, now: datetime) -> None:
        """Put back the available_at of the rows ``claim`` moved (claimed ones included)."""
        TaskRecord.objects.using(self.backend.database).for_backend(self.backend.alias).filter(
            available_at__lte=now - CLAIM_SHIFT / 2
        ).update(available_at=F("available_at") + CLAIM_SHIFT)

    def run(self, row: ClaimedRow) -> TaskResult:
        """Run one claimed task as a worker would, write its outcome, and return its result."""
        config = self.backend.config
        try:
            attempt = attempts.prepare(row, config)
        except Exception as e:  # TaskNotFound, CorruptTask: recorded as the worker does
            self._write(outcomes.unstarted(row, e).outcome)
            return self.backend.get_result(str(row.id))
        Receivers(task_started, self.sender).send_for(attempt.result)
        interrupted: KeyboardInterrupt | None = None
        try:
            ended = outcomes.succeeded(attempt, self._call(attempt), config.max_payload_bytes)
        except Suspended:  # at a sleep or a wait: READY again, written by the step log
            self._store_report(attempt)
            return self.backend.get_result(str(row.id))
        except BaseException as e:  # a task's SystemExit fails it only, as in the worker
            exc = attempts.from_task_frame(e)
            ended = outcomes.after_error(attempt, exc, config.max_snoozes)
            _by_test_clock(ended.outcome)
            if isinstance(e, KeyboardInterrupt):
                # Here Ctrl-C arrives in the task's frame (a worker takes it as a signal): fail
                # the task as a worker would store it, then stop the test run.
                interrupted = e
        self._store_report(attempt)
        self._write(ended.outcome)
        outcomes.report(ended, ended.outcome, Receivers(task_finished, self.sender))
        if interrupted is not None:
            raise interrupted
        return self.backend.get_result(str(row.id))

    def _call(self, attempt: attempts.Attempt) -> Any:
        """Call the task's function; fail with ``TaskTimeout`` if it ran past its timeout.

        A sync function cannot be stopped: it runs to its end, and the outcome is the one the
        worker would store (``TaskTimeout``, the result ignored). An async one is cancelled.
        """
        args, kwargs = attempt.call_args()
        tracing = self.backend.tracing
        if tracing is not None:  # a span for the run, as a worker makes
            with tracing.run(attempt.row):
                return self._call_func(attempt, args, kwargs)
        return self._call_func(attempt, args, kwargs)

    def _call_func(
        self, attempt: attempts.Attempt, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if attempts.is_async(attempt.task):
            return async_to_sync(attempt.call_async)(args, kwargs)
        timeout = attempt.policy.timeout
        started = time.monotonic()
        try:
            value = attempt.task.func(*args, **kwargs)
        finally:
            if timeout is not None and time.monotonic() - started > timeout:
                raise attempt.timed_out()
        return value

    def _store_report(self, attempt: attempts.Attempt) -> None:
        """Write what the attempt reported (``context.set_progress``), in a savepoint: a failed
        write must not break the test's transaction."""
        if attempt.report is None:
            return
        try:
            with transaction.atomic(using=self.backend.database):
                store(self.backend.database, self.worker_id, attempt.report)
        except Exception as e:
            log_failure(attempt.report, e)

    def _write(self, outcome: Outcome) -> None:
        connection = self.connection
        with connection.cursor() as cursor:
            outcomes.write_outcomes(
                connection.alias, self.worker_id, dialect_for(connection), cursor, [outcome]
            )


def _by_test_clock(outcome: Outcome) -> None:
    """Make a retry or snooze due by the test's clock (see advance()), not the database's: in
    a test's transaction, PostgreSQL's clock stands still at the transaction's start."""
    if outcome.delay is not None:
        outcome.available_at = timezone.now() + timedelta(seconds=outcome.delay)
        outcome.delay = None
