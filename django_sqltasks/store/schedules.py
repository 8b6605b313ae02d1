"""Periodic schedules stored in the database: settings' PERIODIC synced into the table, and the
table's rows read back as schedules (``core/schedules.py`` checks them, ``worker/scheduler.py``
enqueues their slots, ``admin/schedules.py`` edits them)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from ..core.backends import SQLBackend
from ..core.schedules import Schedule, default_time_zone, parse_schedule
from ..models import ScheduleRecord

logger = logging.getLogger("django_sqltasks")

# The fields that say when a schedule fires: changing one restarts the schedule (its next slot
# is the first after the change; no slot of the old timing fires late).
TIMING = ("cron", "every", "time_zone")
# Attempts at writing one settings entry when other workers starting at once write it too.
SYNC_ATTEMPTS = 5


def backend_time_zone(backend: SQLBackend) -> str:
    """The zone of a cron schedule that names none: the backend's TIME_ZONE option, else the
    project's (see ``default_time_zone``)."""
    return backend.config.time_zone or default_time_zone()


def definition(schedule: Schedule) -> dict[str, Any]:
    """The stored fields of ``schedule`` (a PERIODIC entry, parsed)."""
    return {
        "task_path": schedule.task_path,
        "args": list(schedule.args),
        "kwargs": dict(schedule.kwargs),
        "cron": schedule.cron or "",
        "every": schedule.every,
        "time_zone": schedule.time_zone if schedule.cron is not None else "",
        "queue_name": schedule.queue_name or "",
        "priority": schedule.priority,
    }


def entry_of(row: ScheduleRecord) -> dict[str, Any]:
    """A row as a PERIODIC entry, the keys ``parse_schedule`` checks; blank fields left out."""
    entry: dict[str, Any] = {"task": row.task_path, "args": row.args, "kwargs": row.kwargs}
    if row.cron:
        entry["cron"] = row.cron
    if row.every is not None:
        entry["every"] = row.every
    if row.time_zone:
        entry["time_zone"] = row.time_zone
    if row.queue_name:
        entry["queue_name"] = row.queue_name
    if row.priority is not None:
        entry["priority"] = row.priority
    return entry


def schedule_of(row: ScheduleRecord, time_zone: str, at: str | None = None) -> Schedule:
    """The schedule a row stores, checked as a PERIODIC entry is; raise ``ScheduleError``
    naming the schedule (or ``at``) and the field (a row edited by SQL may break any rule)."""
    at = at or f"Schedule {row.name!r} of backend {row.backend_name!r}"
    return parse_schedule(at, row.name, entry_of(row), time_zone)


@dataclass
class SyncReport:
    """What a sync of settings' PERIODIC changed in the table, by schedule name."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def sync_settings(backend: SQLBackend) -> SyncReport:
    """Write the backend's PERIODIC entries into the table, marked as coming from settings.

    A new entry is added (first seen by the scheduler's next tick); a changed one is updated,
    restarting its timing if that changed; a row of the admin of the same name is taken over
    (settings win, and a warning says so); a row that settings no longer declare is disabled,
    not deleted, and marked as removed. Safe with several workers starting at once: each write
    is guarded by the row's revision and retried on a lost race.
    """
    records = ScheduleRecord.objects.using(backend.database).filter(backend_name=backend.alias)
    report = SyncReport()
    for schedule in backend.config.periodic.values():
        for _ in range(SYNC_ATTEMPTS):
            outcome = _sync_one(backend, records, schedule)
            if outcome is not None:
                if outcome:
                    getattr(report, outcome).append(schedule.name)
                break
    gone = records.filter(origin=ScheduleRecord.SETTINGS).exclude(
        name__in=list(backend.config.periodic)
    )
    report.removed = list(gone.values_list("name", flat=True))
    if report.removed:
        gone.filter(name__in=report.removed).update(
            origin=ScheduleRecord.REMOVED,
            enabled=False,
            revision=F("revision") + 1,
            updated_at=timezone.now(),
        )
        logger.warning(
            "Periodic task(s) %s are no longer in OPTIONS['PERIODIC'] of backend %s: disabled, "
            "not deleted (delete them in the admin if they are not coming back)",
            ", ".join(report.removed),
            backend.alias,
            extra={"action": "periodic_removed", "schedules": report.removed},
        )
    return report


def _sync_one(backend: SQLBackend, records: Any, schedule: Schedule) -> str | None:
    """Write one entry; return what was done ("created", "updated" or "" for nothing), or
    None when another worker changed the row in between (try again)."""
    wanted = definition(schedule)
    row = records.filter(name=schedule.name).first()
    if row is None:
        try:
            with transaction.atomic(using=backend.database):
                records.create(
                    backend_name=backend.alias,
                    name=schedule.name,
                    origin=ScheduleRecord.SETTINGS,
                    **wanted,
                )
        except IntegrityError:
            return None  # another worker created it first: compare with theirs
        return "created"
    changes = {k: v for k, v in wanted.items() if getattr(row, k) != v}
    if row.origin != ScheduleRecord.SETTINGS:
        changes["origin"] = ScheduleRecord.SETTINGS
        if row.origin == ScheduleRecord.REMOVED:
            changes["enabled"] = True  # disabled by its removal, not by anyone's choice
        else:
            logger.warning(
                "Periodic task %s of backend %s was made in the admin, and OPTIONS['PERIODIC'] "
                "declares one of the same name: the settings' entry replaces it",
                schedule.name,
                backend.alias,
                extra={"action": "periodic_replaced", "schedule": schedule.name},
            )
    if not changes:
        return ""
    # A row stored before schedules had definitions (no task path) keeps its last slot, so an
    # upgrade neither fires nor skips a slot.
    if row.task_path and any(k in changes for k in TIMING):
        changes.update(last_slot=None, next_run_at=None)
    updated = records.filter(pk=row.pk, revision=row.revision).update(
        **changes, revision=row.revision + 1, updated_at=timezone.now()
    )
    return "updated" if updated else None
