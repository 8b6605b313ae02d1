"""The completer: batches finished tasks' outcomes, writes them, and reports them once stored.

Outcomes arrive from any thread (task threads, the event loop) and are written on the writer
thread, many per statement. There is no timer: a write starts as soon as an outcome arrives and
no write is under way, and the outcomes that arrive meanwhile go in the next one. Under load,
batches grow by themselves; when idle, an outcome is written at once.

One bad outcome must not hold up the others. A batch the database refuses is written again one
outcome at a time; an outcome refused on its own is salvaged: its task is marked FAILED with an
``OutcomeNotStored`` error saying why. Only transient errors (see ``Dialect.is_transient``) are
retried, a few times, then the outcomes wait and are written again later (a restart, a
failover, locks held by other transactions), and the heartbeat learns (through ``FailingRoles``)
that this worker is not making progress. Only a transient error that keeps coming back while
the database answers pings (JUDGE_AFTER rounds) is taken to be the statement's fault.

``task_finished`` is sent for a task only after its outcome is stored, on the signal thread.
An ``atomic=True`` task's outcome is written in the task's own transaction instead
(``write_here``), and reported the same way once that transaction commits.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from functools import partial
from typing import TypeVar

from django.db import connections, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from ..compat import TaskResultStatus, task_finished
from ..exceptions import OutcomeNotStored
from ..sql import Dialect, Outcome, dialect_for
from ..sql.retries import is_transient, run_with_retries
from .liveness import FailingRoles
from .outcomes import Ended, failure, report, write_outcomes
from .receivers import Receivers
from .threads import ReceiverThread

logger = logging.getLogger("django_sqltasks")

T = TypeVar("T")

MAX_BATCH = 500  # outcomes written by one statement
WRITE_ATTEMPTS = 3  # calls of one statement on transient errors before judging the outcome
FIRST_WAIT = 0.5  # seconds before writing again when the database does not answer
MAX_WAIT = 5.0  # seconds; the wait doubles up to this while the database stays away
ROUNDS_WHEN_STOPPING = 3  # once the worker stops, give up on an absent database after these
# Rounds in a row of transient errors (not contention) while the database answers pings,
# after which the statement itself is judged: the batch is split and a single outcome that
# still fails is salvaged. A restart or failover is over well before this.
JUDGE_AFTER = 5


class DatabaseAway(Exception):
    """A transient error: the database does not answer, or other transactions hold it up.
    ``answers`` says whether it answered a ping meanwhile (a lost connection may be the
    statement's fault, if it keeps happening while the database answers)."""

    def __init__(self, answers: bool) -> None:
        super().__init__()
        self.answers = answers


class Batch:
    """Outcomes written together, and what became of each.

    Filled under the completer's lock until it is taken for writing; from then on it belongs
    to the writer thread, and after ``on_written`` to the signal thread.
    """

    __slots__ = ("ended", "salvaged", "settled", "written")

    def __init__(self) -> None:
        self.ended: list[Ended] = []
        self.written: set[uuid.UUID] = set()  # stored while the task was still ours
        self.settled: set[uuid.UUID] = set()  # written, salvaged, or given up on
        self.salvaged: dict[uuid.UUID, Outcome] = {}  # what was stored instead, by task id


class Completer:
    """Collect outcomes from any thread; write them on ``executor``; report them after."""

    def __init__(
        self,
        *,
        database: str,
        worker_id: str,
        executor: Executor,
        receivers: ReceiverThread,
        sender: type,
        failing: FailingRoles,
        stopping: threading.Event,
        shared: bool = False,
    ) -> None:
        # Set once here, read from any thread.
        self._database = database
        self._worker_id = worker_id
        self._executor = executor
        self._receivers = receivers
        self._sender = sender
        self._failing = failing
        self._stopping = stopping
        # ``executor`` is the worker's database thread, which also heartbeats and claims: a
        # flush writes one batch, then queues the next behind what waits there meanwhile.
        self._shared = shared
        # Guarded by _lock: the batch filling up, full batches waiting, the batch being
        # written, whether a flush is under way, and the count of outcomes written.
        self._lock = threading.Lock()
        self._current = Batch()
        self._full: deque[Batch] = deque()
        self._writing: Batch | None = None
        self._flushing = False
        self._written = 0
        self._idle = threading.Event()  # set while nothing is submitted and unwritten
        self._idle.set()
        # Told, once a batch is stored, the seconds until the earliest of its tasks that went
        # back to READY (a retry, a snooze) is due: the worker claims it then, not at its
        # next poll. Set by the runner before the first outcome.
        self.on_ready_again: Callable[[float], None] | None = None

    # Called from any thread -------------------------------------------------------------

    def submit(self, ended: Ended) -> None:
        """Queue ``ended`` for writing; it is reported once stored."""
        with self._lock:
            batch = self._current
            batch.ended.append(ended)
            if len(batch.ended) >= MAX_BATCH:
                self._full.append(batch)
                self._current = Batch()
            start = not self._flushing
            if start:
                self._flushing = True
                self._idle.clear()
        if start:
            self._executor.submit(self._flush)

    @property
    def written(self) -> int:
        """How many outcomes have been written (stored or salvaged) so far."""
        with self._lock:
            return self._written

    def pending_ids(self) -> set[uuid.UUID]:
        """Ids of outcomes submitted and not yet settled."""
        with self._lock:
            batches = [*self._full, self._current]
            if self._writing is not None:
                batches.append(self._writing)
            return {e.outcome.id for b in batches for e in b.ended if e.outcome.id not in b.settled}

    def write_here(self, ended: Ended) -> bool:
        """Write ``ended`` on the calling thread's connection, in its open transaction (an
        ``atomic=True`` task's), to be reported once that transaction commits; return whether
        the task was still this worker's."""
        connection = connections[self._database]
        with connection.cursor() as cursor:
            written = self._complete(dialect_for(connection), cursor, [ended.outcome])
        if not written:
            return False
        batch = Batch()
        batch.ended.append(ended)
        batch.written |= written
        batch.settled |= written
        transaction.on_commit(partial(self._settled, batch), using=self._database)
        return True

    @property
    def database(self) -> str:
        """The database alias outcomes are written to."""
        return self._database

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every submitted outcome has been settled; False on timeout."""
        return self._idle.wait(timeout)

    # On the writer thread ---------------------------------------------------------------

    def _take(self) -> Batch | None:
        with self._lock:
            if self._full:
                self._writing = self._full.popleft()
                return self._writing
            batch = self._current
            if not batch.ended:
                self._writing = None
                self._flushing = False
                self._idle.set()
                return None
            self._current = Batch()
            self._writing = batch
            return batch

    def _flush(self) -> None:
        while (batch := self._take()) is not None:
            try:
                self._write(batch)
            except BaseException:  # a bug here must not leave outcomes waiting for ever
                logger.exception("Writing %d task outcome(s) failed", len(batch.ended))
            missing = len(batch.ended) - len(batch.written)
            if missing:
                logger.warning(
                    "%d task outcome(s) were not recorded as they were: those tasks were no "
                    "longer held by this worker (rescued after a stall?), or their outcome "
                    "was refused",
                    missing,
                )
            self._settled(batch)
            if self._shared:
                try:
                    self._executor.submit(self._flush)
                except RuntimeError:  # the thread is shutting down: write the rest here
                    continue
                return

    def _settled(self, batch: Batch) -> None:
        """Count ``batch`` as written and report it (the writer thread, or the thread of an
        atomic task once its transaction commits)."""
        with self._lock:
            self._written += len(batch.settled)
        if self.on_ready_again is not None:
            again = [
                e.outcome
                for e in batch.ended
                if e.outcome.status == TaskResultStatus.READY and e.outcome.id in batch.written
            ]
            if again:
                self.on_ready_again(min(_due_in(o) for o in again))
        if self._reported(batch):
            self._receivers.post(self._send_finished, batch)

    def _reported(self, batch: Batch) -> bool:
        """Whether ``batch`` has a finish that ``task_finished`` reports: some receiver acts
        on a result that did not fail, or a task failed (Django's receiver logs it at ERROR).
        Otherwise no receiver would be called, and the signal thread is left alone."""
        if not Receivers(task_finished, self._sender).idle:
            return True
        failed = TaskResultStatus.FAILED
        return any(e.outcome.status == failed for e in batch.ended) or any(
            o.status == failed for o in batch.salvaged.values()
        )

    def _write(self, batch: Batch) -> None:
        """Settle every outcome of ``batch``, waiting for the database while it is away."""
        rounds = answered = 0
        settled = batch.settled
        while unsettled := [
            e.outcome for e in batch.ended if not settled or e.outcome.id not in settled
        ]:
            try:
                self._store(batch, unsettled, judging=answered >= JUDGE_AFTER)
            except DatabaseAway as e:
                self._failing.failed("writing outcomes")
                rounds += 1
                answered = answered + 1 if e.answers else 0
                if self._stopping.is_set() and rounds > ROUNDS_WHEN_STOPPING:
                    logger.error(
                        "Giving up on writing %d task outcome(s) while stopping (%s): those "
                        "tasks stay RUNNING until their lease runs out, then run again",
                        len(unsettled),
                        _describe(e.__cause__ or e),
                    )
                    batch.settled.update(o.id for o in unsettled)
                    return
                wait = min(MAX_WAIT, FIRST_WAIT * 2 ** (rounds - 1))
                logger.warning(
                    "Writing %d task outcome(s) met a transient error (%s); writing them again "
                    "in %.1fs",
                    len(unsettled),
                    _describe(e.__cause__ or e),
                    wait,
                )
                self._stopping.wait(wait)
            else:
                self._failing.succeeded("writing outcomes")

    def _store(self, batch: Batch, outcomes: list[Outcome], *, judging: bool = False) -> None:
        """Write ``outcomes``; salvage those the database refuses. Raise ``DatabaseAway`` on a
        transient error, unless ``judging`` (see JUDGE_AFTER) and the database answers."""
        dialect = self._dialect()
        for outcome in list(outcomes):
            problem = dialect.outcome_problem(outcome)
            if problem is not None:
                self._salvage(batch, outcome, f"The task's outcome was not stored: {problem}.")
                outcomes.remove(outcome)
        if not outcomes:
            return
        try:
            batch.written |= self._call(lambda d, c: self._complete(d, c, outcomes))
        except Exception as e:
            self._away_unless_judging(e, judging)
            if len(outcomes) == 1:
                reason = f"The database refused this task's outcome ({_describe(e)})."
                self._salvage(batch, outcomes[0], reason)
                return
            logger.error(
                "Writing %d outcome(s) failed (%s); writing them one by one",
                len(outcomes),
                _describe(e),
            )
            for outcome in outcomes:
                self._store(batch, [outcome], judging=judging)
        else:
            batch.settled.update(o.id for o in outcomes)

    def _complete(
        self, dialect: Dialect, cursor: CursorWrapper, outcomes: list[Outcome]
    ) -> set[uuid.UUID]:
        """Write ``outcomes``; a workflow step's also moves its workflow on, in one transaction."""
        return write_outcomes(self._database, self._worker_id, dialect, cursor, outcomes)

    def _salvage(self, batch: Batch, outcome: Outcome, reason: str) -> None:
        """Mark ``outcome``'s task FAILED with an OutcomeNotStored error saying ``reason``."""
        logger.error("Task id=%s: %s", outcome.id, reason, extra={"task_id": outcome.id})
        try:
            written = self._call(lambda d, c: d.salvage(c, self._worker_id, outcome, reason))
        except Exception as e:
            self._away_unless_judging(e, judging=False)
            logger.critical(
                "Task id=%s: marking it FAILED failed too (%s); it stays RUNNING until this "
                "worker stops, then runs again",
                outcome.id,
                _describe(e),
            )
            batch.settled.add(outcome.id)
            return
        stored = failure(outcome.id, OutcomeNotStored(reason))
        batch.salvaged[outcome.id] = stored
        batch.written |= written
        batch.settled.add(outcome.id)

    def _away_unless_judging(self, error: Exception, judging: bool) -> None:
        """Raise ``DatabaseAway`` for a transient ``error``, unless the statement is being
        judged and the error is not contention while the database answers: then it returns,
        and the statement is taken to be at fault, as for any other error."""
        if not is_transient(self._database, error):
            return
        dialect = self._dialect()
        # A server that takes no writes (a fenced primary) refuses every outcome alike: that
        # is no statement's fault, however well it answers a ping.
        refuses_all = dialect.is_contention(error) or dialect.is_read_only(error)
        answers = not refuses_all and self._answers()
        if not (judging and answers):
            raise DatabaseAway(answers) from error

    def _answers(self) -> bool:
        try:
            self._call(lambda d, c: d.ping(c))
        except Exception:
            return False
        return True

    def _call(self, fn: Callable[[Dialect, CursorWrapper], T]) -> T:
        def call() -> T:
            connection = connections[self._database]
            with connection.cursor() as cursor:
                return fn(dialect_for(connection), cursor)

        return run_with_retries(self._database, call, self._stopping, attempts=WRITE_ATTEMPTS)

    def _dialect(self) -> Dialect:
        return dialect_for(connections[self._database])

    # On the signal thread ---------------------------------------------------------------

    def _send_finished(self, batch: Batch) -> None:
        """Update each finished task's result as stored, and send ``task_finished`` for it."""
        receivers = Receivers(task_finished, self._sender)
        written, salvaged = batch.written, batch.salvaged
        for ended in batch.ended:
            task_id = ended.outcome.id
            if task_id in written:  # not: a task that another worker holds now
                stored = salvaged.get(task_id, ended.outcome) if salvaged else ended.outcome
                report(ended, stored, receivers)


def _due_in(outcome: Outcome) -> float:
    """Seconds from now until ``outcome`` (READY again) is due, by this worker's clock."""
    if outcome.available_at is not None:
        return (outcome.available_at - timezone.now()).total_seconds()
    return outcome.delay or 0.0


def _describe(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 2000 else text[:2000] + "..."
