"""Enqueue periodic tasks at their slots (``worker/scheduler.py``): a tick reads the schedule
table's due rows, so a schedule added, changed or disabled in the admin holds from the next.

Unlike the heartbeat's services, the ticks come at the next slot (and at least once an
``interval``), on a thread of their own (``Maintenance._schedule_loop``), so that no table of
schedules, however large, holds up the heartbeat."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from django.utils import timezone

from ..scheduler import Scheduler
from . import Guarded


@dataclass(frozen=True, slots=True)
class Tick:
    """What a tick did: the schedules it fired (None when the clock could not be read), and
    the seconds until the next."""

    fired: list[str] | None
    delay: float


class Schedules:
    """The periodic scheduler's ticks, at most ``interval`` seconds apart."""

    def __init__(self, scheduler: Scheduler, *, interval: float) -> None:
        self.scheduler = scheduler
        self.interval = interval

    def tick(self, guarded: Guarded) -> Tick:
        """Fire the schedules due now; say when the next tick is due."""
        # Slots go by the database's clock; the wait between them by this process's.
        now = guarded("Reading the database's clock", self.scheduler.database_now)
        fired = None
        upcoming = None
        if now is None:
            now = timezone.now()
        else:
            fired = self.scheduler.run_due(now, call=partial(guarded, "Periodic tasks"))
            upcoming = guarded(
                "Reading the next periodic slot", partial(self.scheduler.next_wakeup, now)
            )
        delay = self.interval
        if upcoming is not None:
            delay = min(delay, (upcoming - now).total_seconds())
        # A little past the slot, so that it is the latest one when computed.
        return Tick(fired, max(0.0, delay) + 0.005)
