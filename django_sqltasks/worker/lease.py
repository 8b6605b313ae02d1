"""A worker's lease: its row in the worker table, its heartbeat, the rescue of the dead, and
the cancel requests for the tasks it holds."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from datetime import datetime, timedelta

from django.db import connections
from django.utils import timezone

from ..sql import dialect_for

logger = logging.getLogger("django_sqltasks")


class Lease:
    """Register, heartbeat and unregister one worker; requeue tasks of workers that went silent.

    Every method runs on the worker's database thread; the fields are set once, here.
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
    ) -> None:
        self.worker_id = worker_id
        self.backend_name = backend_name
        self.database = database
        self.queue_names = queue_names
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_rescues = max_rescues

    def register(self) -> None:
        """Insert this worker's row; refuse an id held by a live worker."""
        from ..models import WorkerRecord

        now = timezone.now()
        existing = WorkerRecord.objects.using(self.database).filter(id=self.worker_id).first()
        if existing is not None:
            if existing.heartbeat_at >= now - timedelta(seconds=self.timeout):
                raise RuntimeError(
                    f"Worker id {self.worker_id!r} is in use by a live worker "
                    f"(pid {existing.pid} on {existing.hostname!r}); choose another --worker-id."
                )
            # A dead worker of the same id: requeue its tasks before taking its name.
            connection = connections[self.database]
            with connection.cursor() as cursor:
                dialect_for(connection).requeue_owned(
                    cursor,
                    worker_id=self.worker_id,
                    now=now,
                    reason=f"Worker {self.worker_id} stopped heartbeating while running this "
                    "task; it was put back in the queue when it restarted.",
                )
            existing.delete()
        self._create(now)
        self.rescue(now)

    def heartbeat(self) -> None:
        """Renew the lease, then rescue tasks of workers whose lease ran out."""
        from ..models import WorkerRecord

        now = timezone.now()
        renewed = (
            WorkerRecord.objects.using(self.database)
            .filter(id=self.worker_id)
            .update(heartbeat_at=now)
        )
        if not renewed:
            logger.warning(
                "Worker row of worker_id=%s was gone (declared dead after a stall?); "
                "registering again",
                self.worker_id,
            )
            self._create(now)
        self.rescue(now)

    def cancel_requests(self) -> list[uuid.UUID]:
        """Ids of this worker's RUNNING tasks whose cancellation was asked."""
        from ..models import TaskRecord

        return list(
            TaskRecord.objects.using(self.database)
            .owned_by(self.worker_id)
            .filter(cancel_requested=True)
            .values_list("id", flat=True)
        )

    def unregister(self) -> None:
        from ..models import WorkerRecord

        WorkerRecord.objects.using(self.database).filter(id=self.worker_id).delete()

    def rescue(self, now: datetime) -> int:
        """Requeue RUNNING tasks whose owner has not heartbeaten within the lease timeout (or
        fail those already rescued ``max_rescues`` times)."""
        from ..models import WorkerRecord

        cutoff = now - timedelta(seconds=self.timeout)
        connection = connections[self.database]
        with connection.cursor() as cursor:
            count = dialect_for(connection).requeue_orphans(
                cursor,
                backend_name=self.backend_name,
                live_since=cutoff,
                now=now,
                max_rescues=self.max_rescues,
            )
        if count:
            logger.warning(
                "Rescued %d task(s) of workers silent for over %ss",
                count,
                self.timeout,
                extra={"action": "rescue", "count": count},
            )
        WorkerRecord.objects.using(self.database).filter(heartbeat_at__lt=cutoff).delete()
        return count

    def _create(self, now: datetime) -> None:
        from ..models import WorkerRecord

        WorkerRecord.objects.using(self.database).create(
            id=self.worker_id,
            backend_name=self.backend_name,
            queue_names=self.queue_names or ["*"],
            hostname=socket.gethostname()[:255],
            pid=os.getpid(),
            concurrency=self.concurrency,
            started_at=now,
            heartbeat_at=now,
        )
