"""The worker's periodic tasks: enqueue the due slots of a backend's schedules
(``OPTIONS["PERIODIC"]``, parsed by ``core/schedules.py``), one worker per slot."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import IntegrityError, connections, transaction
from django.utils import timezone as django_timezone

from ..core.resolve import resolve_task
from ..core.schedules import Schedule
from ..core.settings import SQLBackend
from ..models import ScheduleRecord
from ..sql import dialect_for

logger = logging.getLogger("django_sqltasks")


class Scheduler:
    """Enqueue the due slots of a backend's schedules (on the worker's database thread)."""

    def __init__(self, backend: SQLBackend) -> None:
        self.backend = backend
        self.schedules = backend.config.periodic

    def next_wakeup(self, now: datetime) -> datetime | None:
        """When the next slot of any schedule comes; a schedule that fails is logged and left
        out, so one broken schedule never holds up the others."""
        upcoming = []
        for schedule in self.schedules.values():
            try:
                upcoming.append(schedule.next_slot(now))
            except Exception:
                logger.exception(
                    "Periodic task %s: its next slot cannot be computed; the other schedules go on",
                    schedule.name,
                    extra={"action": "periodic_failed", "schedule": schedule.name},
                )
        return min(upcoming, default=None)

    def database_now(self) -> datetime:
        """The current time by the database's clock: every worker computes the same slots,
        whatever its own clock says (a fast one would fire slots early, then stall the others
        until their clocks caught up with the slot it stored)."""
        connection = connections[self.backend.database]
        with connection.cursor() as cursor:
            now = dialect_for(connection).db_now(cursor)
        return now if now.tzinfo is not None else django_timezone.make_aware(now)

    def run_due(self, now: datetime | None = None) -> list[str]:
        """Enqueue every schedule whose latest slot has not fired yet; return their names."""
        now = now or self.database_now()
        fired = []
        for schedule in self.schedules.values():
            try:
                if self._fire(schedule, schedule.latest_slot(now)):
                    fired.append(schedule.name)
            except Exception:  # one broken schedule must never stop the others
                logger.exception(
                    "Periodic task %s could not be enqueued; the other schedules go on",
                    schedule.name,
                    extra={"action": "periodic_failed", "schedule": schedule.name},
                )
        return fired

    def _fire(self, schedule: Schedule, slot: datetime) -> bool:
        database = self.backend.database
        records = ScheduleRecord.objects.using(database)
        with transaction.atomic(using=database):
            # The guarded UPDATE is the election: one worker per slot gets a row changed.
            advanced = records.filter(
                backend_name=self.backend.alias, name=schedule.name, last_slot__lt=slot
            ).update(last_slot=slot)
            if not advanced:
                if records.filter(backend_name=self.backend.alias, name=schedule.name).exists():
                    return False  # this slot fired already
                try:
                    with transaction.atomic(using=database):
                        records.create(
                            backend_name=self.backend.alias, name=schedule.name, last_slot=slot
                        )
                except IntegrityError:
                    pass  # another worker created it first
                return False  # a new schedule starts at its latest slot without firing it
            task = resolve_task(schedule.task_path, backend=self.backend.alias)
            task.enqueue(*schedule.args, **schedule.kwargs)
        logger.info(
            "Enqueued periodic task %s for %s",
            schedule.name,
            slot.isoformat(),
            extra={"action": "periodic", "schedule": schedule.name},
        )
        return True
