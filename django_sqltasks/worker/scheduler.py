"""The worker's periodic tasks: at each tick, read the due schedules of a backend from the
table (settings' PERIODIC synced into it at the first tick, ``store/schedules.py``) and enqueue
their due slots, one worker per slot. Each row stores its next run, so a tick reads what is due,
not the whole table: a table of 300,000 schedules costs a tick what its due rows cost."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from django.db import DatabaseError, connections, transaction
from django.db.models import Q
from django.utils import timezone as django_timezone

from ..core.backends import SQLBackend
from ..core.resolve import resolve_task
from ..core.schedules import Schedule
from ..models import ScheduleRecord
from ..sql import dialect_for
from ..store.schedules import backend_time_zone, entry_of, schedule_of, sync_settings

logger = logging.getLogger("django_sqltasks")

# Characters of an error kept in a row's last_error.
MAX_ERROR_LENGTH = 2000
# Checked rows remembered by a scheduler: a tick reads only the due rows, and the checks of a
# cron expression are remembered by expression (core/schedules.py), so a miss costs little.
MAX_PARSED = 10_000
# Rows a tick reads and fires in one call: where the scheduler shares the worker's database
# thread (SQLite), a heartbeat waits for one batch at most.
BATCH = 200
# Rows with no next run stored (new, changed, enabled again) read in one call: most only store
# their runs, one UPDATE per timing of the batch, so a larger batch costs fewer statements.
UNSEEN_BATCH = 1000

T = TypeVar("T")
# Where a batch of due rows starts: after this (pk,) of the unseen, (next_run_at, pk) of the
# others; () for the first batch.
Key = tuple[Any, ...]
# Runs one database step of a tick, and returns its value, or None if it failed (logged).
Call = Callable[[Callable[[], Any]], Any]


def _here(fn: Callable[[], T]) -> T:
    return fn()


@dataclass(frozen=True)
class Due:
    """A schedule read at a tick, with the row state its election is guarded by."""

    pk: int
    revision: int
    last_slot: datetime | None
    next_run_at: datetime | None
    schedule: Schedule

    @property
    def name(self) -> str:
        return self.schedule.name


class Scheduler:
    """Enqueue the due slots of a backend's schedules.

    A tick reads only the rows due by their ``next_run_at`` (an index serves the read), in
    batches of ``BATCH``, each a call of its own: where the scheduler shares the worker's
    database thread (SQLite), a heartbeat waits for one batch at most, whatever the size of
    the table.
    """

    def __init__(self, backend: SQLBackend) -> None:
        self.backend = backend
        self.synced = False
        # The broken rows already logged, by (pk, revision): logged again once changed.
        self._broken: set[tuple[int, int]] = set()
        # Rows already checked, by what they hold (a row edited by SQL, its revision left as
        # it was, is checked again): checking a cron expression costs more than reading it.
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
        """When the next slot of any schedule comes, as the rows store it (None: no schedule
        has one after ``now``; a row due but not fired yet is read again at the next tick)."""
        return (
            self._enabled()
            .filter(next_run_at__gt=now)
            .order_by("next_run_at")
            .values_list("next_run_at", flat=True)
            .first()
        )

    def database_now(self) -> datetime:
        """The current time by the database's clock: every worker computes the same slots,
        whatever its own clock says (a fast one would fire slots early, then stall the others
        until their clocks caught up with the slot it stored)."""
        connection = connections[self.backend.database]
        with connection.cursor() as cursor:
            now = dialect_for(connection).db_now(cursor)
        return now if now.tzinfo is not None else django_timezone.make_aware(now)

    def run_due(self, now: datetime | None = None, call: Call | None = None) -> list[str]:
        """Enqueue every schedule whose latest slot has not fired yet; return their names.

        ``call`` runs each database step (the sync, the clock, one batch) where the worker
        wants it, and returns None if it failed (logged); by default, here.
        """
        run: Call = call or _here
        if not self.synced:
            run(self.sync)
            if not self.synced:
                return []  # logged; the next tick tries again
        if now is None:
            now = run(self.database_now)
            if now is None:
                return []
        fired: list[str] = []
        for unseen in (True, False):
            after: Key | None = ()
            while after is not None:
                batch = run(partial(self.run_batch, now, unseen, after))
                if batch is None:
                    break  # logged; the next tick reads these rows again
                names, after = batch
                fired += names
        return sorted(fired)

    def run_batch(self, now: datetime, unseen: bool, after: Key) -> tuple[list[str], Key | None]:
        """Fire the next ``BATCH`` due rows after the key ``after`` (``unseen``: the rows with
        no next run stored, new or changed; else those whose next run has come); return the
        names fired and the key to go on from (None: no more)."""
        due, following = self.read(now, unseen, after)
        fired: list[str] = []
        if not due:
            return fired, following
        database = self.backend.database
        # The rows that only store their runs, by what they store: first sight (a start) or a
        # next run stored behind (a move), by the revision read and the values written.
        starts: dict[tuple[int, datetime, datetime], list[int]] = {}
        moves: dict[tuple[int, datetime], list[int]] = {}
        elections = []
        # The slots of each timing, computed once: a table repeats few timings.
        slots: dict[tuple[str | None, float | None, str], tuple[datetime, datetime]] = {}
        for item in due:
            timing = (item.schedule.cron, item.schedule.every, item.schedule.time_zone)
            try:
                if timing not in slots:
                    slots[timing] = (item.schedule.latest_slot(now), item.schedule.next_slot(now))
            except Exception:  # one broken schedule must never stop the others
                self._failed(item)
                continue
            slot, next_run = slots[timing]
            if item.last_slot is None:
                starts.setdefault((item.revision, slot, next_run), []).append(item.pk)
            elif item.last_slot < slot:
                elections.append((item, slot, next_run))
            elif item.next_run_at is None or item.next_run_at <= now:
                moves.setdefault((item.revision, next_run), []).append(item.pk)
        # One transaction a batch: one commit (and its fsync) for up to BATCH rows, instead of
        # one each; the rows that only store their runs are one UPDATE per timing (each row
        # guarded as _fire guards one). A lost connection undoes the batch, which is tried
        # again; any other error in an election undoes that election alone (its savepoint).
        with transaction.atomic(using=database):
            for (revision, slot, next_run), pks in starts.items():
                self._enabled().filter(
                    pk__in=pks, revision=revision, last_slot__isnull=True
                ).update(last_slot=slot, next_run_at=next_run)
            stale = Q(next_run_at__isnull=True) | Q(next_run_at__lte=now)
            for (revision, next_run), pks in moves.items():
                self._enabled().filter(stale, pk__in=pks, revision=revision).update(
                    next_run_at=next_run
                )
            for item, slot, next_run in elections:
                try:
                    if self._elect(item, slot, next_run, now):
                        fired.append(item.name)
                except DatabaseError as e:
                    if dialect_for(connections[database]).is_transient(e):
                        raise
                    self._failed(item)
                except Exception:  # one broken schedule must never stop the others
                    self._failed(item)
        return fired, following

    def _failed(self, item: Due) -> None:
        logger.exception(
            "Periodic task %s could not be enqueued; the other schedules go on",
            item.name,
            extra={"action": "periodic_failed", "schedule": item.name},
        )

    def read(
        self, now: datetime, unseen: bool = False, after: Key = ()
    ) -> tuple[list[Due], Key | None]:
        """One batch of due rows (see ``run_batch``), and the key to read on from (None: this
        was the last batch); a row that breaks a rule is logged (once per revision) and left
        out."""
        rows = self._enabled()
        if unseen:
            rows = rows.filter(next_run_at__isnull=True).order_by("pk")
            if after:
                rows = rows.filter(pk__gt=after[0])
        else:
            rows = rows.filter(next_run_at__lte=now).order_by("next_run_at", "pk")
            if after:
                moment, pk = after
                rows = rows.filter(Q(next_run_at__gt=moment) | Q(next_run_at=moment, pk__gt=pk))
        limit = UNSEEN_BATCH if unseen else BATCH
        read = list(rows[:limit])
        following: Key | None = None
        if len(read) == limit:
            last = read[-1]
            following = (last.pk,) if unseen else (last.next_run_at, last.pk)
        zone = backend_time_zone(self.backend)
        due = []
        for row in read:
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
            due.append(Due(row.pk, row.revision, row.last_slot, row.next_run_at, schedule))
        return due, following

    def _enabled(self) -> Any:
        return ScheduleRecord.objects.using(self.backend.database).filter(
            backend_name=self.backend.alias, enabled=True
        )

    def _schedule_of(self, row: ScheduleRecord, zone: str) -> Schedule:
        key = (row.name, zone, repr(entry_of(row)))
        schedule = self._parsed.get(key)
        if schedule is None:
            schedule = schedule_of(row, zone)  # raises if the row breaks a rule
            if len(self._parsed) >= MAX_PARSED:
                self._parsed.clear()
            self._parsed[key] = schedule
        return schedule

    def _fire(self, item: Due, now: datetime) -> bool:
        """Hold the election of ``item``'s latest slot (or store its runs, if it has no slot to
        fire): ``run_batch`` for one row."""
        schedule = item.schedule
        slot, next_run = schedule.latest_slot(now), schedule.next_slot(now)
        row = self._guarded(item)
        if item.last_slot is not None and item.last_slot >= slot:
            # Fired already, as read at this tick: no election to hold. A next run stored
            # behind it (a row of an earlier version) is moved on, or every tick reads it.
            if item.next_run_at is None or item.next_run_at <= now:
                row.update(next_run_at=next_run)
            return False
        if item.last_slot is None:
            # First sight: the schedule starts at its latest slot without firing it.
            row.filter(last_slot__isnull=True).update(last_slot=slot, next_run_at=next_run)
            return False
        return self._elect(item, slot, next_run, now)

    def _guarded(self, item: Due) -> Any:
        # Guarded by the revision read (a change since makes the next tick read it again) and
        # by enabled (a disable committed since holds at once).
        return ScheduleRecord.objects.using(self.backend.database).filter(
            pk=item.pk, revision=item.revision, enabled=True
        )

    def _elect(self, item: Due, slot: datetime, next_run: datetime, now: datetime) -> bool:
        """Advance ``item``'s row to ``slot``, and if this worker did, enqueue its task in the
        same transaction; return whether it did."""
        schedule, database = item.schedule, self.backend.database
        row = self._guarded(item)
        with transaction.atomic(using=database):
            # The guarded UPDATE is the election: one worker per slot gets a row changed.
            if not row.filter(last_slot__lt=slot).update(last_slot=slot, next_run_at=next_run):
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
