"""The supervisor's database writes, and what it reads of its children's processes.

Each write is owed until it succeeds: kept in order and tried again at the supervisor's next
tick while the database is away, so that a child's tasks are never left RUNNING under a worker
that is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import uuid
from collections.abc import Callable, Iterator, Mapping

from django.db import connections
from django.db.backends.utils import CursorWrapper

from ...models import WorkerRecord
from ...sql import Dialect, dialect_for
from ...sql.retries import run_with_retries
from ..identity import describe_holder, holder_is_gone
from ..lease import WorkerIdInUse
from ..outcomes import failure

logger = logging.getLogger("django_sqltasks")

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
WRITE_ATTEMPTS = 3  # calls of one write on transient errors, per tick
RENEW_ATTEMPTS = 2


class Ledger:
    """The writes a supervisor owes the database; used from the supervisor's one thread."""

    def __init__(
        self, *, database: str, backend_name: str, lease_timeout: float, max_rescues: int | None
    ) -> None:
        self.database = database
        self.backend_name = backend_name
        self.lease_timeout = lease_timeout
        self.max_rescues = max_rescues
        self._writes: list[tuple[str, Callable[[], None]]] = []  # owed, in order

    def end_tasks(
        self, worker_id: str, pid: int, errors: Mapping[uuid.UUID, Exception], reason: str
    ) -> None:
        """Fail the tasks of ``errors`` (held by the killed ``worker_id``, process ``pid``)
        with their errors, and put its other tasks back in the queue saying ``reason``."""
        outcomes = [failure(task_id, error) for task_id, error in errors.items()]

        def write() -> None:
            with self._cursor() as (dialect, cursor):
                dialect.complete(cursor, worker_id, outcomes)
                dialect.requeue_owned(cursor, worker_id=worker_id, reason=reason)
            self._unregister(worker_id, pid)

        self._owe(f"Ending task(s) of {worker_id}", write)

    def rescue(self, worker_id: str, pid: int, how: str) -> None:
        """Rescue the tasks of ``worker_id``, a child (process ``pid``) that is gone (``how``
        says why). Only its own row goes: a live worker of the same id (started elsewhere by
        mistake) keeps its row, and so its tasks, which the rescue takes only from workers
        whose heartbeat is stale by the database's clock."""

        def write() -> None:
            self._unregister(worker_id, pid)
            with self._cursor() as (dialect, cursor):
                count = dialect.requeue_orphans(
                    cursor,
                    backend_name=self.backend_name,
                    lease_timeout=self.lease_timeout,
                    max_rescues=self.max_rescues,
                )
            if count:
                logger.warning(
                    "Rescued %d task(s) of worker process worker_id=%s, which %s",
                    count,
                    worker_id,
                    how,
                    extra={"action": "rescue", "count": count},
                )

        self._owe(f"Rescuing the tasks of worker_id={worker_id}", write)

    def requeue(self, worker_id: str, pid: int, reason: str) -> None:
        """Put the tasks of ``worker_id`` (process ``pid``, killed while stopping) back in
        the queue."""

        def write() -> None:
            with self._cursor() as (dialect, cursor):
                dialect.requeue_owned(cursor, worker_id=worker_id, reason=reason)
            self._unregister(worker_id, pid)

        self._owe(f"Requeueing the tasks of {worker_id}", write)

    def renew(self, worker_ids: list[str]) -> None:
        """Renew the leases of ``worker_ids`` now (not owed: the next tick renews again)."""
        if not worker_ids:
            return

        def renew() -> None:
            with self._cursor() as (dialect, cursor):
                for worker_id in worker_ids:
                    dialect.heartbeat(cursor, worker_id)

        try:
            run_with_retries(self.database, renew, attempts=RENEW_ATTEMPTS)
        except Exception as e:
            logger.warning("Renewing the children's leases failed: %s", e)

    def flush(self) -> None:
        """Make the writes owed, in order; keep those that fail for the next tick."""
        while self._writes:
            what, write = self._writes[0]
            try:
                run_with_retries(self.database, write, attempts=WRITE_ATTEMPTS)
            except Exception:
                logger.exception("%s failed; trying again", what)
                return
            self._writes.pop(0)

    def _owe(self, what: str, write: Callable[[], None]) -> None:
        self._writes.append((what, write))
        self.flush()

    def refuse_live_ids(self, worker_id: str) -> None:
        """Raise ``WorkerIdInUse`` if a live worker holds ``worker_id``, or ``worker_id``-N."""
        live = self.live_ids(worker_id)
        if live:
            raise WorkerIdInUse(
                f"--worker-id: {worker_id!r} is in use: live worker(s) "
                + ", ".join(
                    f"{name} (pid {pid} on {host!r}{describe_holder(process)})"
                    for name, pid, host, process in live
                )
                + f" heartbeat within the last {self.lease_timeout:g}s; give each supervisor "
                "its own id."
            )

    def live_ids(self, worker_id: str) -> list[tuple[str, int, str, str]]:
        """The live workers (id, pid, host, process identity) named ``worker_id`` or
        ``worker_id``-N: those this supervisor's processes would clash with."""
        with self._cursor() as (dialect, cursor):
            rows = [
                (name, pid, host, process)
                for name, pid, host, process in dialect.live_workers_like(
                    cursor, f"{worker_id}-", self.lease_timeout
                )
                if name[len(worker_id) + 1 :].isdigit()
            ]
            own = dialect.live_worker(cursor, worker_id, self.lease_timeout)
        if own is not None:
            rows.append((worker_id, *own))
        # Processes of this host that are gone (a supervisor killed with its children, then
        # restarted) are no clash: each new process takes its name and rescues its tasks.
        return [row for row in rows if not holder_is_gone(row[1], row[2], row[3])]

    def _unregister(self, worker_id: str, pid: int) -> None:
        """Delete the row of ``worker_id`` if process ``pid`` of this host wrote it."""
        WorkerRecord.objects.using(self.database).filter(
            id=worker_id, pid=pid, hostname=socket.gethostname()[:255]
        ).delete()

    @contextlib.contextmanager
    def _cursor(self) -> Iterator[tuple[Dialect, CursorWrapper]]:
        connection = connections[self.database]
        with connection.cursor() as cursor:
            yield dialect_for(connection), cursor


def rss_bytes(pid: int) -> int | None:
    """The resident memory of ``pid`` (Linux), or None if unknown."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


def describe_status(status: int) -> str:
    """A child's exit status, for people."""
    if status < 0:
        return f"signal {signal.Signals(-status).name}"
    return f"status {status}"
