"""Periodic tasks: declared in OPTIONS["PERIODIC"], enqueued by the workers themselves.

Every worker computes the latest slot of each schedule (cron, or a fixed interval aligned to the
Unix epoch) and tries to advance the schedule's row to it with a guarded UPDATE; the worker whose
UPDATE changes the row enqueues the task in the same transaction. So each slot is enqueued once,
however many workers run, and a restart neither fires a slot twice nor replays every missed one:
after downtime, only the latest missed slot fires. A schedule seen for the first time starts at
its latest past slot without firing it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.utils import timezone as django_timezone

if TYPE_CHECKING:
    from .backend import SQLTaskBackend

logger = logging.getLogger("django_sqltasks")

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MAX_NAME_LENGTH = 200  # ScheduleRecord.name


class ScheduleError(ValueError):
    """A PERIODIC entry breaks its rule; the message names the entry and the field."""


@dataclass(frozen=True)
class Schedule:
    """One periodic task: what to enqueue, and when."""

    name: str
    task_path: str
    cron: str | None = None
    every: float | None = None
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)

    def latest_slot(self, now: datetime) -> datetime:
        """The latest slot at or before ``now``."""
        if self.cron is not None:
            from croniter import croniter

            # get_prev is strictly before: step a microsecond past now to include now itself.
            slot: datetime = croniter(self.cron, now + timedelta(microseconds=1)).get_prev(datetime)
            return slot
        assert self.every is not None
        elapsed = (now - EPOCH).total_seconds()
        return EPOCH + timedelta(seconds=math.floor(elapsed / self.every) * self.every)

    def next_slot(self, now: datetime) -> datetime:
        """The first slot after ``now``."""
        if self.cron is not None:
            from croniter import croniter

            slot: datetime = croniter(self.cron, now).get_next(datetime)
            return slot
        assert self.every is not None
        return self.latest_slot(now) + timedelta(seconds=self.every)


def parse_schedules(where: str, raw: Any) -> dict[str, Schedule]:
    """Build schedules from OPTIONS["PERIODIC"]; raise ``ScheduleError`` naming what is wrong."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ScheduleError(f"{where}['PERIODIC'] must be a dict of name -> schedule, not {raw!r}.")
    schedules = {}
    for name, entry in raw.items():
        at = f"{where}['PERIODIC'][{name!r}]"
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_LENGTH:
            raise ScheduleError(
                f"{at}: names must be strings of 1 to {MAX_NAME_LENGTH} characters."
            )
        if not isinstance(entry, Mapping):
            raise ScheduleError(f"{at} must be a dict with 'task' and 'cron' or 'every'.")
        unknown = sorted(set(entry) - {"task", "cron", "every", "args", "kwargs"})
        if unknown:
            raise ScheduleError(f"{at} has unknown key(s) {', '.join(unknown)}.")
        task_path = entry.get("task")
        if not isinstance(task_path, str) or "." not in task_path:
            raise ScheduleError(f"{at}['task'] must be the dotted path of a @task function.")
        cron, every = entry.get("cron"), entry.get("every")
        if (cron is None) == (every is None):
            raise ScheduleError(f"{at} needs exactly one of 'cron' and 'every'.")
        if cron is not None:
            from croniter import croniter

            if not isinstance(cron, str) or not croniter.is_valid(cron):
                raise ScheduleError(f"{at}['cron'] is not a valid cron expression: {cron!r}.")
        if every is not None and (
            isinstance(every, bool)
            or not isinstance(every, (int, float, timedelta))
            or (every.total_seconds() if isinstance(every, timedelta) else every) <= 0
        ):
            raise ScheduleError(f"{at}['every'] must be a positive number of seconds.")
        if isinstance(every, timedelta):
            every = every.total_seconds()
        args, kwargs = entry.get("args", []), entry.get("kwargs", {})
        if not isinstance(args, (list, tuple)) or not isinstance(kwargs, Mapping):
            raise ScheduleError(f"{at}: 'args' must be a list and 'kwargs' a dict.")
        schedules[name] = Schedule(
            name=name,
            task_path=task_path,
            cron=cron,
            every=every,
            args=list(args),
            kwargs=dict(kwargs),
        )
    return schedules


class Scheduler:
    """Enqueue the due slots of a backend's schedules (on the worker's database thread)."""

    def __init__(self, backend: SQLTaskBackend) -> None:
        self.backend = backend
        self.schedules = backend.config.periodic

    def next_wakeup(self, now: datetime) -> datetime | None:
        """When the next slot of any schedule comes."""
        if not self.schedules:
            return None
        return min(schedule.next_slot(now) for schedule in self.schedules.values())

    def run_due(self, now: datetime | None = None) -> list[str]:
        """Enqueue every schedule whose latest slot has not fired yet; return their names."""
        now = now or django_timezone.now()
        fired = []
        for schedule in self.schedules.values():
            try:
                if self._fire(schedule, schedule.latest_slot(now)):
                    fired.append(schedule.name)
            except Exception:
                logger.exception("Periodic task %s could not be enqueued", schedule.name)
        return fired

    def _fire(self, schedule: Schedule, slot: datetime) -> bool:
        from .models import ScheduleRecord
        from .results import resolve_task

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
            task = resolve_task(schedule.task_path)
            task.using(backend=self.backend.alias).enqueue(*schedule.args, **schedule.kwargs)
        logger.info(
            "Enqueued periodic task %s for %s",
            schedule.name,
            slot.isoformat(),
            extra={"action": "periodic", "schedule": schedule.name},
        )
        return True
