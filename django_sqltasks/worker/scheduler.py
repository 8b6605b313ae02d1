"""The worker's periodic tasks: at each tick, read the enabled schedules of a backend from the
table (settings' PERIODIC synced into it at the first tick, ``store/schedules.py``) and enqueue
their due slots, one worker per slot."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import DatabaseError, connections, transaction
from django.utils import timezone as django_timezone

from ..core.resolve import resolve_task
from ..core.schedules import Schedule
from ..core.settings import SQLBackend
from ..models import ScheduleRecord
from ..sql import dialect_for
from ..store.schedules import backend_time_zone, entry_of, schedule_of, sync_settings

logger = logging.getLogger("django_sqltasks")

# Characters of an error kept in a row's last_error.
MAX_ERROR_LENGTH = 2000
# Checked rows remembered by a scheduler (a table of schedules is far smaller).
MAX_PARSED = 1000


@dataclass(frozen=True)
class Due:
    """A schedule read at a tick, with the row state its election is guarded by."""

    pk: int
    revision: int
    last_slot: datetime | None
    schedule: Schedule


class Scheduler:
    """Enqueue the due slots of a backend's schedules (on the worker's database thread)."""

    def __init__(self, backend: SQLBackend) -> None:
        self.backend = backend
        self.synced = False
        # The schedules read at the last tick, by name (next_wakeup reads them).
        self.schedules: dict[str, Schedule] = {}
        # The broken rows already logged, by (pk, revision): logged again once changed.
        self._broken: set[tuple[int, int]] = set()
        # Rows already checked, by what they hold (a row edited by SQL, its revision left as
        # it was, is checked again): a tick re-reads every row, and checking a cron
        # expression costs more than reading it.
        self._parsed: dict[tuple[str, str, str], Schedule] = {}

    def sync(self) -> None:
        """Write settings' PERIODIC into the table (once, at the first tick of a worker)."""
        report = sync_settings(self.backend)
        self.synced = True
        if report.created or report.updated:
            logger.info(
                "Periodic tasks from settings: added %s, updated %s",
                ", ".join(report.created) or "none",
                ", ".join(report.updated) or "none",
                extra={"action": "periodic_synced"},
            )

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

    def read(self) -> list[Due]:
        """The enabled schedules of the table; a row that breaks a rule is logged (once per
        revision) and left out."""
        zone = backend_time_zone(self.backend)
        rows = ScheduleRecord.objects.using(self.backend.database).filter(
            backend_name=self.backend.alias, enabled=True
        )
        due = []
        for row in rows.order_by("name"):
            try:
                schedule = self._schedule_of(row, zone)
            except Exception as e:
                if (row.pk, row.revision) not in self._broken:
                    self._broken.add((row.pk, row.revision))
                    logger.error(
                        "Periodic task %s is skipped until it is fixed: %s",
                        row.name,
                        e,
                        extra={"action": "periodic_failed", "schedule": row.name},
                    )
                continue
            due.append(Due(row.pk, row.revision, row.last_slot, schedule))
        return due

    def _schedule_of(self, row: ScheduleRecord, zone: str) -> Schedule:
        key = (row.name, zone, repr(entry_of(row)))
        schedule = self._parsed.get(key)
        if schedule is None:
            schedule = schedule_of(row, zone)  # raises if the row breaks a rule
            if len(self._parsed) >= MAX_PARSED:
                self._parsed.clear()
            self._parsed[key] = schedule
        return schedule

    def run_due(self, now: datetime | None = None) -> list[str]:
        """Enqueue every schedule whose latest slot has not fired yet; return their names."""
        if not self.synced:
            self.sync()
        now = now or self.database_now()
        due = self.read()
        self.schedules = {d.schedule.name: d.schedule for d in due}
        fired = []
        for item in due:
            try:
                if self._fire(item, now):
                    fired.append(item.schedule.name)
            except Exception:  # one broken schedule must never stop the others
                logger.exception(
                    "Periodic task %s could not be enqueued; the other schedules go on",
                    item.schedule.name,
                    extra={"action": "periodic_failed", "schedule": item.schedule.name},
                )
        return fired

    def _fire(self, item: Due, now: datetime) -> bool:
        schedule = item.schedule
        slot = schedule.latest_slot(now)
        if item.last_slot is not None and item.last_slot >= slot:
            return False  # fired already, as read at this tick: no election to hold
        database = self.backend.database
        # Guarded by the revision read (a change since makes the next tick read it again) and
        # by enabled (a disable committed since holds at once).
        row = ScheduleRecord.objects.using(database).filter(
            pk=item.pk, revision=item.revision, enabled=True
        )
        following = schedule.next_slot(now)
        if item.last_slot is None:
            # First sight: the schedule starts at its latest slot without firing it.
            row.filter(last_slot__isnull=True).update(last_slot=slot, next_run_at=following)
            return False
        with transaction.atomic(using=database):
            # The guarded UPDATE is the election: one worker per slot gets a row changed.
            if not row.filter(last_slot__lt=slot).update(last_slot=slot, next_run_at=following):
                return False  # this slot fired already (or the row changed)
            try:
                with transaction.atomic(using=database):
                    task = resolve_task(schedule.task_path, backend=self.backend.alias)
                    # None keeps the task's own queue and priority.
                    task = task.using(queue_name=schedule.queue_name, priority=schedule.priority)
                    result = task.enqueue(*schedule.args, **schedule.kwargs)
            except DatabaseError:
                raise  # the database's fault, not the row's: the slot is tried again
            except Exception as e:
                # The row's fault (its task does not import, its arguments do not fit): the
                # slot is spent, so the error is logged once a slot, not once a tick.
                error = f"{type(e).__name__}: {e}"[:MAX_ERROR_LENGTH]
                row.update(last_run_at=now, last_error=error)
                logger.error(
                    "Periodic task %s enqueued nothing for %s, the other schedules go on: %s",
                    schedule.name,
                    slot.isoformat(),
                    error,
                    extra={"action": "periodic_failed", "schedule": schedule.name},
                )
                return False
            ScheduleRecord.objects.using(database).filter(pk=item.pk).update(
                last_run_at=now, last_task_id=result.id, last_error=""
            )
        logger.info(
            "Enqueued periodic task %s for %s",
            schedule.name,
            slot.isoformat(),
            extra={"action": "periodic", "schedule": schedule.name},
        )
        return True
