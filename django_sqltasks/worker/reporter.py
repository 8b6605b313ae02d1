"""The worker's progress writer: running tasks' reports (``context.set_progress`` and
``set_metadata``) are kept in memory and written to their rows at most once per heartbeat, and
once more as each attempt ends, before its outcome.

A task that reports nothing costs nothing here: its attempt never reaches the writer. A write
that fails is logged and counted, never raised: a report is informative, and must not fail its
task nor stop the worker.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from concurrent.futures import Executor, Future
from functools import partial

from django.db import DatabaseError
from django.db.models import Q

from ..core.progress import AttemptReport, live_writers
from ..models import TaskRecord
from ..sql.retries import is_transient, reset
from ..store.moved import rerun_if_moved

logger = logging.getLogger("django_sqltasks")

FINAL_WAIT = 5.0  # seconds an ending attempt waits for its last report to be written


class Reporter:
    """Coalesce reports in memory and write them on the worker's database thread.

    Task threads and the event loop call ``changed`` and ``finish``; the heartbeat thread calls
    ``flush_soon``; the writes run on the database thread. The maps and counters are behind
    the lock.
    """

    def __init__(self, *, database: str, worker_id: str, db: Executor) -> None:
        self.database = database  # set once, read from any thread
        self.worker_id = worker_id
        self._db = db
        self._lock = threading.Lock()
        self._changed: dict[uuid.UUID, AttemptReport] = {}  # reports to write at the next flush
        self._active: dict[uuid.UUID, AttemptReport] = {}  # running attempts that reported
        self.written = 0
        self.failed = 0
        live_writers.add(self)  # for the metrics (ops/metrics.py) to read

    # Any thread ---------------------------------------------------------------------------

    def changed(self, report: AttemptReport) -> None:
        """``report`` changed since it was last written (called once per write, not per call)."""
        with self._lock:
            self._changed[report.task_id] = report
            self._active[report.task_id] = report

    def flush_soon(self) -> None:
        """Write the changed reports on the database thread (the heartbeat calls it)."""
        if self._changed:  # unlocked read: only a hint, the flush takes the lock
            self._db.submit(self.flush)

    def finish(self, report: AttemptReport) -> Future[None] | None:
        """The attempt of ``report`` ended: write its last change now, on the database thread;
        None if there is nothing to write."""
        with self._lock:
            self._active.pop(report.task_id, None)
            self._changed.pop(report.task_id, None)
        if not report.unwritten:
            return None
        try:
            return self._db.submit(self._write, report)
        except RuntimeError:  # the database thread has shut down (a forced stop)
            return None

    def running(self) -> list[AttemptReport]:
        """The reports of the attempts running now that have reported something."""
        with self._lock:
            return list(self._active.values())

    def counts(self) -> tuple[int, int]:
        """Reports written and writes failed, since the worker started."""
        with self._lock:
            return self.written, self.failed

    # The database thread ------------------------------------------------------------------

    def flush(self) -> None:
        """Write every report changed since the last flush."""
        with self._lock:
            pending, self._changed = self._changed, {}
        for report in pending.values():
            self._write(report)

    def _write(self, report: AttemptReport) -> None:
        try:
            written = store(self.database, self.worker_id, report)
        except Exception as e:
            if isinstance(e, DatabaseError) and is_transient(self.database, e):
                reset(self.database)
            with self._lock:
                self.failed += 1
                if report.task_id in self._active:
                    self._changed[report.task_id] = report  # try again at the next flush
            log_failure(report, e)
            return
        if written:
            with self._lock:
                self.written += 1


def store(database: str, worker_id: str, report: AttemptReport) -> bool:
    """Write ``report`` to its task's row if it changed since it was last written, and the row
    is still its attempt's; return whether a write was made. A failed write raises, and the
    report is written again with its next change."""
    taken = report.take()
    if taken is None:
        return False
    # Only while the row is still this attempt's: not after another worker claimed it again (a
    # rescue), nor after a snooze gave the attempt back.
    rows = (
        TaskRecord.objects.using(database)
        .filter(id=report.task_id, attempts=report.claims)
        .filter(Q(owner=worker_id) | Q(owner__isnull=True))
    )
    try:
        # A task that finishes meanwhile moves partition (PostgreSQL): run again, the write
        # finds its row where it is now.
        rerun_if_moved(database, partial(rows.update, progress=taken.to_json()))
    except BaseException:
        report.untake()
        raise
    return True


def log_failure(report: AttemptReport, error: BaseException) -> None:
    logger.warning(
        "Writing the progress of task id=%s failed (%s); the task goes on",
        report.task_id,
        error,
        extra={"action": "progress_write_failed", "task_id": report.task_id},
    )


async def aend_report(reporter: Reporter | None, report: AttemptReport | None) -> None:
    """Write an ended attempt's last report, waiting up to FINAL_WAIT (the event loop)."""
    future = _finish(reporter, report)
    if future is not None:
        try:
            await asyncio.wait_for(asyncio.wrap_future(future), FINAL_WAIT)
        except TimeoutError:  # the write goes on, guarded by the attempt
            _not_written_yet(report)


def end_report(reporter: Reporter | None, report: AttemptReport | None) -> None:
    """Write an ended attempt's last report, waiting up to FINAL_WAIT (a task thread)."""
    future = _finish(reporter, report)
    if future is not None:
        try:
            future.result(timeout=FINAL_WAIT)
        except Exception:  # a timeout: the write goes on, guarded by the attempt
            _not_written_yet(report)


def _finish(reporter: Reporter | None, report: AttemptReport | None) -> Future[None] | None:
    """The write of ``report``'s last change, if there is one to write."""
    return None if reporter is None or report is None else reporter.finish(report)


def _not_written_yet(report: AttemptReport | None) -> None:
    task_id = None if report is None else report.task_id
    logger.warning("The last progress report of task id=%s is not written yet", task_id)
