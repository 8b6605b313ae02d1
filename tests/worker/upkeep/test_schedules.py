"""The scheduler's ticks: a tick fires the schedules due and says when the next is due (at the
next slot, at most an interval away); a tick that cannot read the clock waits an interval."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import F

from django_sqltasks.compat import task_backends
from django_sqltasks.models import ScheduleRecord, TaskRecord
from django_sqltasks.worker.scheduler import Scheduler
from django_sqltasks.worker.upkeep.schedules import Schedules
from tests.worker.upkeep.conftest import Guard

TICK = "tests.tasks.tick"
HOUR = 3600.0


def test_a_tick_fires_what_is_due_and_waits_for_the_next_slot(db: None, guard: Guard) -> None:
    ScheduleRecord.objects.create(backend_name="default", name="hourly", task_path=TICK, every=HOUR)
    schedules = Schedules(Scheduler(task_backends["default"]), interval=2 * HOUR)
    first = schedules.tick(guard)
    assert first.fired == []  # first sight: it starts at its latest slot
    assert 0.005 <= first.delay <= HOUR + 0.005  # the next slot, not the interval
    # Time is data: the slot it last fired an hour further back, its next run come.
    ScheduleRecord.objects.update(
        last_slot=F("last_slot") - timedelta(seconds=HOUR),
        next_run_at=F("next_run_at") - timedelta(seconds=HOUR),
    )
    second = schedules.tick(guard)
    assert second.fired == ["hourly"]
    assert TaskRecord.objects.filter(task_path=TICK).count() == 1
    assert guard.ran[0] == "Reading the database's clock"


def test_a_tick_that_cannot_read_the_clock_fires_nothing_and_waits_an_interval(
    db: None, guard: Guard
) -> None:
    guard.failing = True
    tick = Schedules(Scheduler(task_backends["default"]), interval=30).tick(guard)
    assert (tick.fired, tick.delay) == (None, 30.005)
    assert guard.ran == ["Reading the database's clock"]
