"""A worker's claim statements, on its database thread: the main claim and the limited one, a
suspect to run alone, and putting back what a failed claim or a stop leaves RUNNING."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from functools import partial
from time import perf_counter
from typing import Any, TypeVar

from django.db import connections
from django.db.backends.utils import CursorWrapper

from ..sql import ClaimedRow, Dialect, Scope, SuspectRow, dialect_for
from ..sql.marks import ClaimMarks
from .claim_meter import ClaimMeter
from .completer import Completer
from .limited import limited_claim_for
from .slots import Slots

logger = logging.getLogger("django_sqltasks")

T = TypeVar("T")

FAILED_CLAIM = "The claim that took this task failed before the worker saw it."
LOST_CONNECTION = (
    "The worker's connection to the database was lost; once it was back, the database had "
    "this task RUNNING for the worker, which no longer held it (its outcome or its claim lost "
    "in a failover, or a claim the worker never saw)."
)
SUSPECT_CANDIDATES = 8  # suspects read per claim_suspect: the next ones if others took the first


class Claims:
    """Claim tasks for one worker. Every method runs on the worker's database thread; the
    fields are set once, here, but ``_claim_uncertain`` and the limited claim's state, which
    are the database thread's (the loop reads ``limited_active`` and ``uncertain`` as hints),
    and ``connection_lost``, which any thread sets (``meter`` guards its own)."""

    def __init__(
        self,
        *,
        backend: Any,
        worker_id: str,
        queue_names: list[str] | None,
        slots: Slots,
        completer: Completer,
        connection_lost: threading.Event | None = None,
        meter: ClaimMeter | None = None,
    ) -> None:
        self.backend_name: str = backend.alias
        self.database: str = backend.database
        self.worker_id = worker_id
        self.queue_names = queue_names
        self._slots = slots
        self._completer = completer
        self._limited = limited_claim_for(backend, worker_id, queue_names)
        self._main_scope = Scope(exclude_queues=self._limited.excluded)
        self._main_excluded = self._limited.excluded
        self._main_marks = ClaimMarks()  # where the main claim starts reading (sql/marks.py)
        self._claim_uncertain = False  # a claim failed without telling us what it took
        # Set by any thread that saw one of the worker's connections lost: the server it
        # reconnects to (after a failover, another one) may have RUNNING tasks of this worker
        # that it does not hold. Cleared by the claim that puts those back.
        self.connection_lost = connection_lost or threading.Event()
        self.meter = meter  # times the main claim (also run on the loop: worker/native.py)

    @property
    def main_scope(self) -> Scope:
        """What the main claim takes: tasks of no limit, outside the limited queues (which
        an override can change: see ``LimitedClaim.excluded``)."""
        excluded = self._limited.excluded
        if excluded is not self._main_excluded:
            self._main_scope = Scope(exclude_queues=excluded)
            self._main_excluded = excluded
            self._main_marks.reset()
        return self._main_scope

    @property
    def uncertain(self) -> bool:
        """Whether the next claim first puts back what the database says this worker holds and
        it does not (then it runs here, not on the loop)."""
        return self._claim_uncertain or self.connection_lost.is_set()

    @property
    def limited_active(self) -> bool:
        """Whether limited tasks are claimed first (then the claim runs here, not on the loop)."""
        return self._limited.active

    def claim(self, limit: int, after_failed_claim: bool = False) -> list[ClaimedRow]:
        """Claim up to ``limit`` due tasks: limited ones first, then the main claim's."""
        self._put_back_unknown(after_failed_claim)
        self._claim_uncertain = True
        limited = self._limited
        rows: list[ClaimedRow] = []
        if limited.active:
            # Limited tasks first: the main claim would otherwise fill every free slot of a
            # busy worker, and they would wait for it to run dry.
            rows = self._cursor_call(lambda d, c: limited.claim(d, c, limit))
        if len(rows) < limit:
            rows += self._cursor_call(partial(self._main_claim, limit - len(rows)))
        self._claim_uncertain = False
        return rows

    def _main_claim(self, limit: int, dialect: Dialect, cursor: CursorWrapper) -> list[ClaimedRow]:
        """The main claim's statement, timed for the meter."""
        marks, scope = self._main_marks, self.main_scope
        passes = marks.full_passes
        started = perf_counter()
        rows = dialect.claim(
            cursor,
            backend_name=self.backend_name,
            queue_names=self.queue_names,
            worker_id=self.worker_id,
            limit=limit,
            scope=scope,
            marks=marks,
        )
        if self.meter is not None:
            took = perf_counter() - started
            self.meter.record(took, len(rows), full_pass=marks.full_passes > passes)
        return rows

    def claim_suspects(self, beside: int, alone: bool) -> list[tuple[ClaimedRow, SuspectRow]]:
        """Claim the suspects (see ``Dialect.requeue_orphans``) that wait, within their
        limits: up to ``beside`` of a first death, to run beside each other, and (``alone``)
        one suspect to run alone in one slot; each with what its claim read of it."""
        self._put_back_unknown()
        self._claim_uncertain = True
        found = self._cursor_call(
            lambda d, c: d.suspects(
                c,
                backend_name=self.backend_name,
                queue_names=self.queue_names,
                limit=beside + SUSPECT_CANDIDATES,
            )
        )
        claimed: list[tuple[ClaimedRow, SuspectRow]] = []
        for suspect in found:
            if not (beside if suspect.together else alone):
                continue
            row = self._cursor_call(partial(self._limited.claim_suspect, suspect=suspect))
            if row is None:
                continue
            claimed.append((row, suspect))
            if suspect.together:
                beside -= 1
            else:
                alone = False  # one suspect runs alone at a time
        self._claim_uncertain = False
        return claimed

    def _put_back_unknown(self, after_failed_claim: bool = False) -> None:
        """Put back the RUNNING tasks of this worker that it does not hold, where the last
        claim failed mid-way (it may have committed rows we never saw) or a connection was
        lost (the server may be another, with claims or outcomes of ours it lacks): our
        heartbeat would keep them RUNNING forever."""
        lost = self.connection_lost.is_set()
        if not (self._claim_uncertain or after_failed_claim or lost):
            return
        self._claim_uncertain = True  # until the statement below has run
        self.connection_lost.clear()  # a loss seen from now on puts back again
        try:
            count = self.requeue_owned(LOST_CONNECTION if lost else FAILED_CLAIM, keep_known=True)
        except BaseException:
            if lost:
                self.connection_lost.set()
            raise
        if count:
            logger.warning(
                "Requeued %d task(s) this worker held no more, after %s",
                count,
                "a lost connection" if lost else "a failed claim",
                extra={"action": "requeued_unknown", "count": count},
            )

    def clear_suspect(self, task_id: uuid.UUID) -> bool:
        """Clear the suspect ``task_id`` running here past its time bound (see
        ``Dialect.clear_suspect``)."""
        return self._cursor_call(lambda d, c: d.clear_suspect(c, task_id, self.worker_id))

    def suspects_waiting(self) -> bool:
        return self._cursor_call(
            lambda d, c: d.suspects_waiting(
                c, backend_name=self.backend_name, queue_names=self.queue_names
            )
        )

    def scan_limits(self) -> None:
        """Look for due tasks of a concurrency limit (the limited claim keeps its own pace)."""
        self._cursor_call(self._limited.scan)

    def limited_waiting(self) -> bool:
        """Whether due limited tasks wait for a slot of their limit."""
        return self._cursor_call(self._limited.waiting)

    def requeue_owned(self, reason: str, *, keep_known: bool = False) -> int:
        """Put this worker's RUNNING tasks back to READY; with ``keep_known``, only those it
        does not know it holds (held, or with an outcome waiting to be written)."""
        keep: set[uuid.UUID] = set()
        if keep_known:
            keep = self._slots.held_ids() | self._completer.pending_ids()
        return self._cursor_call(
            lambda d, c: d.requeue_owned(
                c, worker_id=self.worker_id, reason=reason, keep=list(keep)
            )
        )

    def _cursor_call(self, fn: Callable[[Dialect, CursorWrapper], T]) -> T:
        connection = connections[self.database]
        with connection.cursor() as cursor:
            return fn(dialect_for(connection), cursor)
