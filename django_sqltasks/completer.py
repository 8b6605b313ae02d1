"""Batched outcome writes: many finished tasks, one UPDATE, while the next batch gathers."""

from __future__ import annotations

import logging
import threading
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from .sql import Outcome

logger = logging.getLogger("django_sqltasks")

MAX_BATCH = 500  # outcomes written by one statement
RETRY_DELAY = 1.0  # seconds between attempts when a write keeps failing


class Batch:
    """Outcomes written together; ``written`` holds the ids whose rows were still ours."""

    __slots__ = ("contexts", "future", "outcomes", "written")

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []
        self.contexts: list[Any] = []  # whatever the submitter needs back, per outcome
        self.written: set[uuid.UUID] = set()
        self.future: Future[Batch] = Future()


class Completer:
    """Collect outcomes from any thread and write them on the database executor.

    There is no timer: a write starts as soon as an outcome arrives and no write is under way;
    outcomes arriving during a write wait for the next one. Under load, batches grow by
    themselves; when idle, an outcome is written at once.
    """

    def __init__(
        self,
        write: Callable[[list[Outcome]], set[uuid.UUID]],
        executor: Executor,
        on_written: Callable[[Batch], None],
    ) -> None:
        self._write = write
        self._executor = executor
        self._on_written = on_written
        self._lock = threading.Lock()
        self._current = Batch()
        self._full: deque[Batch] = deque()
        self._writing: Batch | None = None
        self._flushing = False
        self._idle = threading.Event()
        self._idle.set()

    def submit(self, outcome: Outcome, context: Any = None) -> Batch:
        """Queue ``outcome``; return the batch it will be written with."""
        with self._lock:
            batch = self._current
            batch.outcomes.append(outcome)
            batch.contexts.append(context)
            if len(batch.outcomes) >= MAX_BATCH:
                self._full.append(batch)
                self._current = Batch()
            start = not self._flushing
            if start:
                self._flushing = True
                self._idle.clear()
        if start:
            self._executor.submit(self._flush)
        return batch

    def pending_ids(self) -> set[uuid.UUID]:
        """Ids of outcomes submitted and not yet written."""
        with self._lock:
            batches = [*self._full, self._current]
            if self._writing is not None:
                batches.append(self._writing)
            return {o.id for batch in batches for o in batch.outcomes}

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every submitted outcome has been written."""
        return self._idle.wait(timeout)

    def _take(self) -> Batch | None:
        with self._lock:
            if self._full:
                self._writing = self._full.popleft()
                return self._writing
            batch = self._current
            if not batch.outcomes:
                self._writing = None
                self._flushing = False
                self._idle.set()
                return None
            self._current = Batch()
            self._writing = batch
            return batch

    def _flush(self) -> None:
        while (batch := self._take()) is not None:
            while True:
                try:
                    batch.written = self._write(batch.outcomes)
                    break
                except Exception:
                    logger.exception(
                        "Writing %d task outcome(s) failed; retrying", len(batch.outcomes)
                    )
                    threading.Event().wait(RETRY_DELAY)
            missing = len(batch.outcomes) - len(batch.written)
            if missing:
                logger.warning(
                    "%d task outcome(s) were not recorded: those tasks were no longer held by "
                    "this worker (rescued after a stall?)",
                    missing,
                )
            batch.future.set_result(batch)
            self._on_written(batch)
