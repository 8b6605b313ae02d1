"""A worker's lease: its row in the worker table, its heartbeat, the rescue of the dead, and
the cancel requests for the tasks it holds."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Iterator

from django.db import connections
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from ..models import TaskRecord, WorkerRecord
from ..sql import Dialect, dialect_for
from . import events
from .claim_meter import ClaimMeter
from .identity import describe_holder, holder_is_gone, this_process

logger = logging.getLogger("django_sqltasks")

# The exit status of a worker refused because a live worker holds its id: a supervisor that
# sees it stops, rather than starting the process again and again.
EXIT_ID_IN_USE = 78  # EX_CONFIG (sysexits.h): a configuration error


class WorkerIdInUse(RuntimeError):
    """A live worker (its heartbeat fresh by the database's clock) holds this worker id."""


class Lease:
    """Register, heartbeat and unregister one worker; requeue tasks of workers that went silent.

    Every method runs on the worker's database thread; the fields are set once, here (the
    claim meter guards its own).
    """

    def __init__(
        self,
        *,
        worker_id: str,
        backend_name: str,
        database: str,
        queue_names: list[str] | None,
        concurrency: int,
        timeout: float,
        max_rescues: int | None = None,
        claims: ClaimMeter | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.backend_name = backend_name
        self.database = database
        self.queue_names = queue_names
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_rescues = max_rescues
        self.claims = claims  # what the claims cost, published at each heartbeat

    def register(self) -> None:
        """Insert this worker's row; refuse an id held by a live worker."""
        with self._cursor() as (dialect, cursor):
            live = dialect.live_worker(cursor, self.worker_id, self.timeout)
        if live is not None and not holder_is_gone(*live):
            raise WorkerIdInUse(
                f"--worker-id: {self.worker_id!r} is in use by a live worker (pid "
                f"{live[0]} on {live[1]!r}{describe_holder(live[2])}, heartbeat within the "
                f"last {self.timeout:g}s). If that is this worker's previous run (restarted on "
                "another host, or where another process now has its pid), its lease runs out in "
                f"about {self._lease_left():.0f}s (LEASE_TIMEOUT), and the id is free then: start "
                "again after that. Otherwise give each worker its own id."
            )
        # A previous worker of this id is dead: its lease ran out, or (a service manager
        # restarting it) its process is gone from this host's PID namespace. Drop its row, so
        # that the rescue takes its tasks now, before this worker takes its name.
        if WorkerRecord.objects.using(self.database).filter(id=self.worker_id).delete()[0]:
            self.rescue()
        self._create()
        self.rescue()
        events.emit("registered", worker_id=self.worker_id)

    def _lease_left(self) -> float:
        """Seconds until this id's current holder's lease runs out, if it beats no more."""
        beat = (
            WorkerRecord.objects.using(self.database)
            .filter(id=self.worker_id)
            .values_list("heartbeat_at", flat=True)
            .first()
        )
        if beat is None:
            return 0.0
        return max(0.0, self.timeout - (timezone.now() - beat).total_seconds())

    def heartbeat(self) -> None:
        """Renew the lease (publishing what the recent claims cost), then rescue tasks of
        workers whose lease ran out."""
        claims = self.claims.window() if self.claims is not None else None
        with self._cursor() as (dialect, cursor):
            renewed = dialect.heartbeat(cursor, self.worker_id, claims)
        if not renewed:
            logger.warning(
                "Worker row of worker_id=%s was gone (declared dead after a stall?); "
                "registering again",
                self.worker_id,
            )
            self._create()
        self.rescue()

    def cancel_requests(self) -> list[uuid.UUID]:
        """Ids of this worker's RUNNING tasks whose cancellation was asked."""
        return list(
            TaskRecord.objects.using(self.database)
            .owned_by(self.worker_id)
            .filter(cancel_requested=True)
            .values_list("id", flat=True)
        )

    def suspects_waiting(self) -> bool:
        """Whether a suspect (see ``Dialect.requeue_orphans``) waits that this worker may
        run alone."""
        with self._cursor() as (dialect, cursor):
            return dialect.suspects_waiting(
                cursor, backend_name=self.backend_name, queue_names=self.queue_names
            )

    def unregister(self) -> None:
        WorkerRecord.objects.using(self.database).filter(id=self.worker_id).delete()

    def rescue(self) -> int:
        """Requeue RUNNING tasks whose owner has not heartbeaten within the lease timeout (or
        fail those already rescued ``max_rescues`` times), by the database's clock."""
        with self._cursor() as (dialect, cursor):
            count = dialect.requeue_orphans(
                cursor,
                backend_name=self.backend_name,
                lease_timeout=self.timeout,
                max_rescues=self.max_rescues,
            )
            dialect.forget_dead_workers(cursor, self.timeout)
        if count:
            logger.warning(
                "Rescued %d task(s) of workers silent for over %ss",
                count,
                self.timeout,
                extra={"action": "rescue", "count": count},
            )
        events.emit("rescue_pass", worker_id=self.worker_id, count=count)
        return count

    def _create(self) -> None:
        now = timezone.now()  # started_at is for people; the lease is renewed by the database
        WorkerRecord.objects.using(self.database).create(
            id=self.worker_id,
            backend_name=self.backend_name,
            queue_names=self.queue_names or ["*"],
            hostname=socket.gethostname()[:255],
            pid=os.getpid(),
            process=this_process().text(),
            concurrency=self.concurrency,
            started_at=now,
            heartbeat_at=now,
        )
        with self._cursor() as (dialect, cursor):
            dialect.heartbeat(cursor, self.worker_id)

    @contextlib.contextmanager
    def _cursor(self) -> Iterator[tuple[Dialect, CursorWrapper]]:
        connection = connections[self.database]
        with connection.cursor() as cursor:
            yield dialect_for(connection), cursor
