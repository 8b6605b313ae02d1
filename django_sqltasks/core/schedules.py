"""Periodic tasks: declared in OPTIONS["PERIODIC"] or made in the admin, kept in the schedule
table (``store/schedules.py``), enqueued by the workers themselves. This module holds their
rules and slot arithmetic, with no database: the checks of each key (shared by the settings'
parsing, the admin's form and the scheduler's reading of a row) and ``Schedule``.

Every worker computes the latest slot of each schedule (cron, or a fixed interval aligned to the
Unix epoch) and tries to advance the schedule's row to it with a guarded UPDATE; the worker whose
UPDATE changes the row enqueues the task in the same transaction. So each slot is enqueued once,
however many workers run, and a restart neither fires a slot twice nor replays every missed one:
after downtime, only the latest missed slot fires. A schedule seen for the first time starts at
its latest past slot without firing it.

Cron expressions are read in a time zone (the schedule's, else the backend's TIME_ZONE option,
else settings.TIME_ZONE when USE_TZ is on, else UTC), on the wall clock of that zone. Where
daylight saving time skips a wall time, its slot fires once, at the change. Where it repeats a
wall time, a schedule that fires every hour (its hour field ``*`` or ``*/n``, such as
``*/5 * * * *``) fires at both occurrences, so its runs go on at their pace through the repeated
hour, as cron's do; one that names its hours (``30 2 * * *``) fires once, at the first.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings

from ..compat import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY
from .columns import (
    MAX_CRON_LENGTH,
    MAX_NAME_LENGTH,
    MAX_SCHEDULE_NAME_LENGTH,
    MAX_TASK_PATH_LENGTH,
)
from .serialization import check_arguments, text_problem

logger = logging.getLogger("django_sqltasks")

UTC = timezone.utc
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Bounds of 'every', in seconds. Below a second the schedule would flood the table (and a
# worker's periodic thread); over a year, a cron expression says it better, and huge values
# (1e300) overflow datetime arithmetic.
MIN_EVERY = 1.0
MAX_EVERY = 366 * 24 * 3600.0
# Cron slots walked past, at most, to find the one around a daylight-saving change: a repeated
# hour of a per-minute expression holds 60, and a rare expression's slots are far apart.
MAX_SLOTS_WALKED = 10_000
# Fields of a cron expression: minute, hour, day of month, month, day of week. croniter also
# reads a sixth (seconds, or a year), which the docs, the admin's field and the slot arithmetic
# here do not: it is refused, not taken for another meaning.
CRON_FIELDS = 5
KEYS = {"task", "cron", "every", "args", "kwargs", "time_zone", "queue_name", "priority"}


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
    time_zone: str = "UTC"  # an IANA name; the wall clock cron expressions are read on
    queue_name: str | None = None  # None: the task's own queue
    priority: int | None = None  # None: the task's own priority

    def latest_slot(self, now: datetime) -> datetime:
        """The latest slot at or before ``now`` (an aware datetime, in UTC)."""
        if self.cron is None:
            assert self.every is not None
            elapsed = (now - EPOCH).total_seconds()
            return EPOCH + timedelta(seconds=math.floor(elapsed / self.every) * self.every)
        # Measured start-up cost: 11 ms to import, paid only with cron schedules.
        from croniter import croniter

        zone = ZoneInfo(self.time_zone)
        every_hour = _every_hour(self.cron)
        wall = _wall(now, zone)
        # In a repeated hour, wall times up to the end of its first pass have happened already.
        walls = croniter(self.cron, wall + _fold_shift(wall, zone) + timedelta(microseconds=1))
        best: datetime | None = None
        for _ in range(MAX_SLOTS_WALKED):
            candidate = walls.get_prev(datetime)
            moments = _instants(candidate, zone, every_hour)
            if best is not None and moments[-1] < best:
                return best  # earlier wall times only fire earlier
            for moment in moments:
                if moment <= now and (best is None or moment > best):
                    best = moment
        raise ScheduleError(f"No slot of {self.cron!r} found before {now.isoformat()}.")

    def next_slot(self, now: datetime) -> datetime:
        """The first slot after ``now`` (an aware datetime, in UTC)."""
        if self.cron is None:
            assert self.every is not None
            return self.latest_slot(now) + timedelta(seconds=self.every)
        # Measured start-up cost: 11 ms to import, paid only with cron schedules.
        from croniter import croniter

        zone = ZoneInfo(self.time_zone)
        every_hour = _every_hour(self.cron)
        wall = _wall(now, zone)
        # In a repeated hour, wall times of its second pass may still be ahead.
        walls = croniter(self.cron, wall - _fold_shift(wall, zone))
        best: datetime | None = None
        for _ in range(MAX_SLOTS_WALKED):
            candidate = walls.get_next(datetime)
            moments = _instants(candidate, zone, every_hour)
            if best is not None and moments[0] > best:
                return best  # later wall times only fire later
            for moment in moments:
                if moment > now and (best is None or moment < best):
                    best = moment
        raise ScheduleError(f"No slot of {self.cron!r} found after {now.isoformat()}.")


def _every_hour(cron: str) -> bool:
    """Whether ``cron`` fires in every hour (its hour field is ``*`` or a step of it): such a
    schedule fires through an hour the clocks repeat as through any other, as cron does."""
    fields = cron.split()
    return len(fields) == CRON_FIELDS and fields[1].startswith("*")


def _instants(wall: datetime, zone: ZoneInfo, every_hour: bool) -> list[datetime]:
    """The moments (UTC, in order) a cron slot at ``wall`` fires: once (the first occurrence
    of a repeated wall time, the end of a skipped one), or at both occurrences of a repeated
    wall time for a schedule that fires every hour."""
    first = _instant(wall, zone)
    if every_hour:
        second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
        if second != first and _wall(second, zone) == wall:  # repeated, not skipped
            return [first, second]
    return [first]


def _wall(moment: datetime, zone: ZoneInfo) -> datetime:
    """The naive wall-clock time of ``moment`` in ``zone``."""
    return moment.astimezone(zone).replace(tzinfo=None)


def _offset(wall: datetime, zone: ZoneInfo, fold: int) -> timedelta:
    offset = wall.replace(tzinfo=zone, fold=fold).utcoffset()
    assert offset is not None
    return offset


def _fold_shift(wall: datetime, zone: ZoneInfo) -> timedelta:
    """How far apart the two occurrences of ``wall`` are (zero unless the clocks repeat it)."""
    return abs(_offset(wall, zone, 0) - _offset(wall, zone, 1))


def _instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The moment (UTC) a cron slot at ``wall`` fires: its first occurrence if the clocks
    repeat it, the end of the gap if they skip it."""
    moment = wall.replace(tzinfo=zone).astimezone(UTC)  # fold=0: the first occurrence
    if _wall(moment, zone) == wall:
        return moment
    # Skipped: fold 0 and 1 read the wall time with the offsets before and after the change,
    # which lies between them. Find it to the second (time zone changes fall on whole seconds).
    ends = sorted(int(wall.replace(tzinfo=zone, fold=f).timestamp()) for f in (0, 1))
    low, high = ends[0], ends[1]

    def offset_at(second: int) -> timedelta | None:
        return datetime.fromtimestamp(second, zone).utcoffset()

    after = offset_at(high)
    while high - low > 1:
        middle = (low + high) // 2
        if offset_at(middle) == after:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)


def default_time_zone() -> str:
    """settings.TIME_ZONE when USE_TZ is on (the zone the project works in), else UTC."""
    return settings.TIME_ZONE if settings.USE_TZ and settings.TIME_ZONE else "UTC"


def check_time_zone(where: str, name: Any) -> str:
    """Return ``name`` if it is a time zone zoneinfo knows; raise ``ScheduleError`` if not."""
    try:
        if not isinstance(name, str):
            raise TypeError
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError) as e:
        raise ScheduleError(
            f"{where} must be an IANA time zone name such as 'Europe/Paris' or 'UTC', not "
            f"{short_repr(name)}."
        ) from e
    return name


def parse_schedules(where: str, raw: Any, time_zone: str = "UTC") -> dict[str, Schedule]:
    """Build schedules from OPTIONS["PERIODIC"]; raise ``ScheduleError`` naming what is wrong.

    ``time_zone`` is the zone of cron schedules that name none.
    """
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ScheduleError(f"{where}['PERIODIC'] must be a dict of name -> schedule, not {raw!r}.")
    schedules = {}
    for name, entry in raw.items():
        at = f"{where}['PERIODIC'][{name!r}]"
        if not isinstance(name, str) or not 0 < len(name) <= MAX_SCHEDULE_NAME_LENGTH:
            raise ScheduleError(
                f"{at}: names must be strings of 1 to {MAX_SCHEDULE_NAME_LENGTH} characters."
            )
        if not isinstance(entry, Mapping):
            raise ScheduleError(f"{at} must be a dict with 'task' and 'cron' or 'every'.")
        schedules[name] = parse_schedule(at, name, entry, time_zone)
    return schedules


def parse_schedule(at: str, name: str, entry: Mapping[str, Any], time_zone: str) -> Schedule:
    """Build one schedule from a PERIODIC entry (or a stored row, as the same keys); raise
    ``ScheduleError`` starting with ``at`` and naming the key that breaks its rule.

    ``time_zone`` is the zone of a cron schedule whose entry names none.
    """
    unknown = sorted(set(entry) - KEYS, key=str)
    if unknown:
        raise ScheduleError(f"{at} has unknown key(s) {', '.join(map(str, unknown))}.")
    task_path = check_task_path(f"{at}['task']", entry.get("task"))
    cron, every = entry.get("cron"), entry.get("every")
    if (cron is None) == (every is None):
        raise ScheduleError(f"{at} needs exactly one of 'cron' and 'every'.")
    if cron is not None:
        check_cron(f"{at}['cron']", cron)
        if "time_zone" in entry:
            time_zone = check_time_zone(f"{at}['time_zone']", entry["time_zone"])
    else:
        if "time_zone" in entry:
            raise ScheduleError(
                f"{at}['time_zone'] applies to 'cron' only: 'every' counts seconds from the "
                "Unix epoch, the same in every time zone."
            )
        every = check_every(f"{at}['every']", every)
    args, kwargs = entry.get("args", []), entry.get("kwargs", {})
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, Mapping):
        raise ScheduleError(f"{at}: 'args' must be a list and 'kwargs' a dict.")
    try:
        check_arguments(list(args), dict(kwargs))
    except TypeError as e:  # InvalidTaskArguments: it names the argument and the rule
        raise ScheduleError(f"{at}: {e}") from e
    queue_name = entry.get("queue_name")
    if queue_name is not None:
        check_queue_name(f"{at}['queue_name']", queue_name)
    priority = entry.get("priority")
    if priority is not None:
        check_priority(f"{at}['priority']", priority)
    return Schedule(
        name=name,
        task_path=task_path,
        cron=cron,
        every=every,
        args=list(args),
        kwargs=dict(kwargs),
        time_zone=time_zone,
        queue_name=queue_name,
        priority=priority,
    )


def short_repr(value: Any) -> str:
    """``repr(value)``, cut to a readable length (a form may post megabytes)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


# The checks of one key each: ``where`` names the key (``...['cron']``, or a form's "This
# field"), and starts the message of the ``ScheduleError`` raised.


def check_task_path(where: str, task_path: Any) -> str:
    """Return ``task_path`` if it can be a task's dotted path (it is not imported here)."""
    if (
        not isinstance(task_path, str)
        or "." not in task_path
        or len(task_path) > MAX_TASK_PATH_LENGTH
        or text_problem(task_path) is not None
    ):
        raise ScheduleError(
            f"{where} must be the dotted path of a @task function (at most "
            f"{MAX_TASK_PATH_LENGTH} characters), not {short_repr(task_path)}."
        )
    return task_path


def check_cron(where: str, cron: Any) -> str:
    """Return ``cron`` if croniter reads it and it fires at least once."""
    if not isinstance(cron, str) or len(cron) > MAX_CRON_LENGTH or text_problem(cron) is not None:
        problem: str | None = "invalid"
    else:
        problem = _cron_problem(cron)
    if problem == "fields":
        raise ScheduleError(
            f"{where} is not a valid cron expression: it must have five fields (minute, hour, "
            f"day of month, month, day of week; such as '0 3 * * *' for 03:00 every day), not "
            f"{len(cron.split())}: {short_repr(cron)}."
        )
    if problem == "invalid":
        raise ScheduleError(
            f"{where} is not a valid cron expression (five fields, such as '0 3 * * *' for "
            f"03:00 every day): {short_repr(cron)}."
        )
    if problem == "never":
        raise ScheduleError(
            f"{where} never fires: {cron!r} names no date that exists (such as 31 February)."
        )
    return cron


@lru_cache(maxsize=4096)
def _cron_problem(cron: str) -> str | None:
    """What is wrong with ``cron`` ("fields", "invalid", "never"), or None. Remembered by
    expression: a scheduler checks each row it reads, and a table repeats few expressions."""
    # Measured start-up cost: 11 ms to import, paid only with cron schedules.
    from croniter import CroniterBadDateError, croniter

    if len(cron.split()) != CRON_FIELDS:
        return "fields"
    if not croniter.is_valid(cron):
        return "invalid"
    try:
        croniter(cron, datetime.now(UTC).replace(tzinfo=None)).get_next(datetime)
    except CroniterBadDateError:
        return "never"
    return None


def check_every(where: str, every: Any) -> float:
    """Return ``every`` (seconds, or a timedelta) as seconds, if within the bounds."""
    seconds = every.total_seconds() if isinstance(every, timedelta) else every
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or not MIN_EVERY <= seconds <= MAX_EVERY
    ):
        raise ScheduleError(
            f"{where} must be a number of seconds from {MIN_EVERY:g} to {MAX_EVERY:g} "
            f"(366 days), not {short_repr(every)}; use 'cron' for longer periods."
        )
    return float(seconds)


def check_queue_name(where: str, queue_name: Any) -> str:
    """Return ``queue_name`` if a queue column can store it (not whether the backend has it)."""
    if (
        not isinstance(queue_name, str)
        or not 0 < len(queue_name) <= MAX_NAME_LENGTH
        or text_problem(queue_name) is not None
    ):
        raise ScheduleError(
            f"{where} must be a queue name of 1 to {MAX_NAME_LENGTH} characters (without NUL "
            f"or lone surrogates), not {short_repr(queue_name)}."
        )
    return queue_name


def check_priority(where: str, priority: Any) -> int:
    """Return ``priority`` if it is a task priority."""
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not TASK_MIN_PRIORITY <= priority <= TASK_MAX_PRIORITY
    ):
        raise ScheduleError(
            f"{where} must be a whole number from {TASK_MIN_PRIORITY} to {TASK_MAX_PRIORITY}, "
            f"not {short_repr(priority)}."
        )
    return priority
