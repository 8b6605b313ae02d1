"""Periodic tasks: each slot enqueued once, whatever the number of workers or restarts."""

from __future__ import annotations

import itertools
import logging
import math
import signal
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections

from django_sqltasks.compat import task_backends
from django_sqltasks.core.options import BackendOptions, OptionError
from django_sqltasks.core.schedules import MIN_EVERY, Schedule
from django_sqltasks.models import ScheduleRecord, TaskRecord
from django_sqltasks.worker.scheduler import Scheduler
from tests.conftest import WorkerProcess, set_backend_options
from tests.events import EventLog

pytestmark = pytest.mark.django_db


def periodic_settings(settings: Any, periodic: dict[str, Any]) -> None:
    set_backend_options(settings, PERIODIC=periodic)


def scheduler() -> Scheduler:
    return Scheduler(task_backends["default"])


def at(hour: int, minute: int, second: float = 0) -> datetime:
    return datetime(2030, 1, 1, hour, minute, tzinfo=UTC) + timedelta(seconds=second)


def test_slots_of_cron_and_interval_schedules() -> None:
    cron = Schedule(name="c", task_path="tests.tasks.tick", cron="*/5 * * * *")
    assert cron.latest_slot(at(10, 7)) == at(10, 5)
    assert cron.latest_slot(at(10, 5)) == at(10, 5)
    assert cron.next_slot(at(10, 5)) == at(10, 10)
    every = Schedule(name="e", task_path="tests.tasks.tick", every=90)
    assert every.latest_slot(at(10, 7)) == at(10, 6, 0)
    assert every.next_slot(at(10, 7)) == at(10, 7, 30)


def test_a_new_schedule_starts_without_firing_then_fires_each_slot_once(settings: Any) -> None:
    periodic_settings(settings, {"report": {"task": "tests.tasks.tick", "cron": "*/5 * * * *"}})
    assert scheduler().run_due(at(10, 7)) == []  # first sight: starts at 10:05, fires nothing
    assert ScheduleRecord.objects.get(name="report").last_slot == at(10, 5)
    assert scheduler().run_due(at(10, 9)) == []  # same slot
    assert scheduler().run_due(at(10, 10)) == ["report"]
    assert scheduler().run_due(at(10, 11)) == []  # a second worker, or a restart: no double
    assert TaskRecord.objects.filter(task_path="tests.tasks.tick").count() == 1


@pytest.mark.django_db(transaction=True)
def test_after_downtime_only_the_latest_missed_slot_fires(settings: Any) -> None:
    periodic_settings(settings, {"report": {"task": "tests.tasks.tick", "every": 60}})
    scheduler().run_due(at(10, 0))
    assert scheduler().run_due(at(12, 30, 10)) == ["report"]
    assert TaskRecord.objects.count() == 1
    assert ScheduleRecord.objects.get(name="report").last_slot == at(12, 30)


@pytest.mark.django_db(transaction=True)
def test_arguments_are_passed(settings: Any) -> None:
    periodic_settings(
        settings,
        {"report": {"task": "tests.tasks.tick", "every": 60, "kwargs": {"label": "hourly"}}},
    )
    scheduler().run_due(at(10, 0))
    scheduler().run_due(at(10, 1))
    assert TaskRecord.objects.get().kwargs == {"label": "hourly"}


@pytest.mark.django_db(transaction=True)
def test_concurrent_schedulers_fire_a_slot_once(settings: Any) -> None:
    periodic_settings(settings, {"report": {"task": "tests.tasks.tick", "every": 60}})
    scheduler().run_due(at(10, 0))
    fired: list[list[str]] = []
    barrier = threading.Barrier(6)

    def run() -> None:
        try:
            barrier.wait()
            fired.append(scheduler().run_due(at(10, 1)))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(fired) == [[]] * 5 + [["report"]]
    assert TaskRecord.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_workers_enqueue_each_slot_once(
    settings: Any, worker_process: Callable[..., WorkerProcess], events: EventLog
) -> None:
    periodic = {"tick": {"task": "tests.tasks.tick", "every": 1}}
    env = {"SQLTASKS_PERIODIC_EVERY": "1"}
    workers = [worker_process("--concurrency", "2", env=env) for _ in range(2)]
    periodic_settings(settings, periodic)
    events.wait("task_finished", task="tests.tasks.tick", count=4)
    # Once both have stopped, every slot either enqueued is in the table.
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.output
    enqueued = list(
        TaskRecord.objects.filter(task_path="tests.tasks.tick").values_list(
            "enqueued_at", flat=True
        )
    )
    slots = [t.replace(microsecond=0) for t in enqueued]
    assert len(slots) == len(set(slots)), sorted(slots)  # one task per one-second slot


TICK = "tests.tasks.tick"


@pytest.mark.parametrize(
    ("periodic", "message"),
    [
        ({"x": {"task": TICK}}, "needs exactly one of 'cron' and 'every'"),
        ({"x": {"task": TICK, "cron": "nope"}}, "is not a valid cron expression"),
        (
            {"x": {"task": TICK, "cron": "* * * * * *"}},
            "['cron'] is not a valid cron expression: it must have five fields",
        ),
        ({"x": {"task": "tick", "every": 5}}, "'task'] must be the dotted path"),
        ({"x": {"task": TICK, "every": 5, "when": 1}}, "unknown key(s) when"),
        ("daily", "must be a dict of name -> schedule"),
        # every: finite, at least MIN_EVERY, at most MAX_EVERY
        *[
            ({"x": {"task": TICK, "every": every}}, "['every'] must be a number of seconds from 1")
            for every in (0, -5, 0.5, 1e-6, math.nan, math.inf, -math.inf, 1e300, True, "60")
        ],
        ({"x": {"task": TICK, "every": timedelta(days=400)}}, "to 3.16224e+07 (366 days)"),
        # cron expressions that never fire
        *[
            ({"x": {"task": TICK, "cron": cron}}, f"['cron'] never fires: {cron!r} names no")
            for cron in ("0 0 31 2 *", "0 0 30 2 *", "0 0 31 4 *")
        ],
        # arguments that are not storable JSON
        ({"x": {"task": TICK, "every": 5, "args": [math.nan]}}, "args[0] is nan"),
        ({"x": {"task": TICK, "every": 5, "kwargs": {"a": math.inf}}}, "kwargs['a'] is inf"),
        ({"x": {"task": TICK, "every": 5, "args": ["\x00"]}}, "args[0] contains a NUL"),
        ({"x": {"task": TICK, "every": 5, "kwargs": {1: 2}}}, "name 1 is of type int"),
        ({"x": {"task": TICK, "every": 5, "args": [object()]}}, "args[0] is a builtins.object"),
        # time zones
        ({"x": {"task": TICK, "cron": "0 3 * * *", "time_zone": "Mars/Base"}}, "IANA time zone"),
        ({"x": {"task": TICK, "cron": "0 3 * * *", "time_zone": "../etc"}}, "IANA time zone"),
        ({"x": {"task": TICK, "every": 60, "time_zone": "UTC"}}, "applies to 'cron' only"),
    ],
)
def test_bad_schedules_are_refused_naming_the_schedule_and_field(
    periodic: Any, message: str
) -> None:
    with pytest.raises(OptionError) as info:
        BackendOptions.parse("default", {"PERIODIC": periodic})
    assert message in str(info.value)
    if isinstance(periodic, dict):
        assert "TASKS['default']['OPTIONS']['PERIODIC']['x']" in str(info.value)


def test_a_bad_backend_time_zone_is_refused() -> None:
    with pytest.raises(OptionError, match=r"\['TIME_ZONE'\] must be an IANA time zone name"):
        BackendOptions.parse("default", {"TIME_ZONE": "Europe/Atlantis"})


def test_every_at_its_bounds_is_accepted() -> None:
    periodic = {
        "a": {"task": TICK, "every": MIN_EVERY},
        "b": {"task": TICK, "every": timedelta(days=366)},
        "c": {"task": TICK, "cron": "0 0 29 2 *"},  # leap days: every four years
    }
    assert len(BackendOptions.parse("default", {"PERIODIC": periodic}).periodic) == 3


def test_a_bad_schedule_is_a_check_error(settings: Any) -> None:
    """check (E002) refuses what once killed the scheduler thread."""
    periodic_settings(settings, {"x": {"task": TICK, "every": math.nan}})
    messages = list(task_backends["default"].check())
    assert [m.id for m in messages] == ["django_sqltasks.E002"]
    assert "['PERIODIC']['x']['every']" in messages[0].msg


# One broken schedule never stops the others ---------------------------------------------------


def test_a_schedule_that_fails_at_run_time_does_not_stop_the_others(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    periodic_settings(
        settings,
        {
            "gone": {"task": "tests.tasks.renamed_since", "every": 60},
            "refused": {"task": TICK, "every": 60, "kwargs": {"unexpected": 1}},
            "good": {"task": TICK, "every": 60},
        },
    )
    periodic = scheduler()
    assert periodic.run_due(at(10, 0)) == []  # first sight of each
    # A row that slipped past every check (written by SQL) and breaks the slot arithmetic.
    ScheduleRecord.objects.create(
        backend_name="default", name="broken", task_path=TICK, cron="61 * * * *"
    )
    with caplog.at_level(logging.ERROR, logger="django_sqltasks"):
        assert periodic.run_due(at(10, 1)) == ["good"]
        assert periodic.next_wakeup(at(10, 1)) == at(10, 2)
    failed = {r.schedule for r in caplog.records if getattr(r, "action", "") == "periodic_failed"}
    assert failed == {"broken", "gone", "refused"}  # refused: its kwargs do not fit tick()
    assert periodic.run_due(at(10, 2)) == ["good"]
    assert TaskRecord.objects.filter(task_path=TICK).count() == 2


def test_a_schedule_whose_arguments_do_not_fit_its_task_is_a_check_error(settings: Any) -> None:
    periodic_settings(settings, {"x": {"task": TICK, "every": 60, "kwargs": {"unexpected": 1}}})
    messages = list(task_backends["default"].check())
    assert [m.id for m in messages] == ["django_sqltasks.E005"]
    assert "got an unexpected keyword argument 'unexpected'" in messages[0].msg


def test_a_schedule_of_a_task_declared_for_another_backend_is_a_check_error(
    settings: Any,
) -> None:
    periodic_settings(settings, {"x": {"task": "tests.tasks_hardening.on_immediate", "every": 60}})
    messages = list(task_backends["default"].check())
    assert [m.id for m in messages] == ["django_sqltasks.E005"]
    assert "declared for backend 'immediate'" in messages[0].msg


# Time zones and daylight saving time ----------------------------------------------------------


def utc(month: int, day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2025, month, day, hour, minute, tzinfo=UTC)


def walk(schedule_cron: str, start: datetime, end: datetime, settings: Any) -> list[datetime]:
    """Run the scheduler once a minute from ``start`` to ``end``; return the slots that fired."""
    periodic_settings(
        settings, {"s": {"task": TICK, "cron": schedule_cron, "time_zone": "Europe/Paris"}}
    )
    ScheduleRecord.objects.all().delete()  # each walk starts with a schedule seen first
    TaskRecord.objects.all().delete()
    fired = []
    now = start
    periodic = scheduler()  # one worker's, running through the night
    while now <= end:
        if periodic.run_due(now):
            fired.append(ScheduleRecord.objects.get(name="s").last_slot)
        now += timedelta(minutes=1)
    assert TaskRecord.objects.count() == len(fired)
    return fired


def test_a_wall_time_skipped_by_daylight_saving_fires_once_at_the_change(settings: Any) -> None:
    """Paris, 30 March 2025: at 01:00 UTC the clocks go from 02:00 to 03:00."""
    fired = walk("30 2 * * *", utc(3, 29, 20), utc(3, 30, 6), settings)
    assert fired == [utc(3, 30, 1)]  # 03:00 CEST, the moment 02:30 would have been
    every_quarter = walk("*/15 * * * *", utc(3, 30, 0), utc(3, 30, 1, 30), settings)
    assert [f.strftime("%H:%M") for f in every_quarter] == [
        "00:15", "00:30", "00:45", "01:00", "01:15", "01:30"
    ]  # fmt: skip


def test_a_wall_time_repeated_by_daylight_saving_fires_once_unless_every_hour(
    settings: Any,
) -> None:
    """Paris, 26 October 2025: at 01:00 UTC the clocks go from 03:00 back to 02:00."""
    fired = walk("30 2 * * *", utc(10, 25, 20), utc(10, 26, 6), settings)
    assert fired == [utc(10, 26, 0, 30)]  # 02:30 CEST, the first of the two
    # Every hour: the repeated hour fires as any other, so the runs keep their pace.
    half_hourly = walk("*/30 * * * *", utc(10, 25, 23), utc(10, 26, 3), settings)
    assert [f.strftime("%H:%M") for f in half_hourly] == [
        "23:30", "00:00", "00:30", "01:00", "01:30", "02:00", "02:30", "03:00"
    ]  # fmt: skip


def test_a_frequent_cron_has_no_gap_at_the_autumn_change(settings: Any) -> None:
    """*/5 in Paris went 65 minutes without a run across the repeated hour."""
    fired = walk("*/5 * * * *", utc(10, 25, 23, 30), utc(10, 26, 2, 30), settings)
    gaps = {later - earlier for earlier, later in itertools.pairwise(fired)}
    assert gaps == {timedelta(minutes=5)}, sorted(gaps)
    assert (fired[0], fired[-1]) == (utc(10, 25, 23, 35), utc(10, 26, 2, 30))
    every = Schedule(name="p", task_path=TICK, cron="*/5 * * * *", time_zone="Europe/Paris")
    assert every.next_slot(utc(10, 26, 0, 55)) == utc(10, 26, 1, 0)  # 02:00 CET, the repeat
    assert every.latest_slot(utc(10, 26, 1, 7)) == utc(10, 26, 1, 5)


def test_next_slot_across_daylight_saving_changes() -> None:
    paris = Schedule(name="p", task_path=TICK, cron="30 2 * * *", time_zone="Europe/Paris")
    assert paris.next_slot(utc(3, 30, 0, 59)) == utc(3, 30, 1)
    assert paris.next_slot(utc(3, 30, 1)) == utc(3, 31, 0, 30)
    assert paris.next_slot(utc(10, 26, 0)) == utc(10, 26, 0, 30)
    assert paris.next_slot(utc(10, 26, 0, 31)) == utc(10, 27, 1, 30)  # not the repeat at 01:30
    assert paris.latest_slot(utc(10, 26, 1, 45)) == utc(10, 26, 0, 30)


def test_cron_reads_the_wall_clock_of_its_time_zone() -> None:
    daily = {"task": TICK, "cron": "0 9 * * *"}
    options = BackendOptions.parse(
        "default",
        {
            "TIME_ZONE": "America/New_York",
            "PERIODIC": {"ny": daily, "tokyo": {**daily, "time_zone": "Asia/Tokyo"}},
        },
    )
    assert options.periodic["ny"].next_slot(utc(1, 1, 0)) == utc(1, 1, 14)  # EST, UTC-5
    assert options.periodic["ny"].next_slot(utc(7, 1, 0)) == utc(7, 1, 13)  # EDT, UTC-4
    assert options.periodic["tokyo"].next_slot(utc(1, 1, 0)) == utc(1, 1, 0) + timedelta(days=1)


@pytest.mark.parametrize(("use_tz", "expected"), [(True, "Europe/Paris"), (False, "UTC")])
def test_the_default_time_zone_is_the_projects(settings: Any, use_tz: bool, expected: str) -> None:
    settings.TIME_ZONE = "Europe/Paris"
    settings.USE_TZ = use_tz
    options = BackendOptions.parse(
        "default", {"PERIODIC": {"x": {"task": TICK, "cron": "0 3 * * *"}}}
    )
    assert options.periodic["x"].time_zone == expected


def test_a_schedule_naming_a_non_task_is_a_check_error(settings: Any) -> None:
    periodic_settings(settings, {"x": {"task": "tests.tasks.NOT_A_TASK", "every": 5}})
    messages = list(task_backends["default"].check())
    assert [m.id for m in messages] == ["django_sqltasks.E005"]


def test_a_schedule_on_a_queue_not_in_queues_is_a_check_error(settings: Any) -> None:
    periodic_settings(settings, {"x": {"task": TICK, "every": 60, "queue_name": "nowhere"}})
    messages = list(task_backends["default"].check())
    assert [m.id for m in messages] == ["django_sqltasks.E005"]
    assert "['queue_name'] is 'nowhere', which is not in QUEUES" in messages[0].msg


def test_queue_and_priority_of_a_settings_entry(settings: Any) -> None:
    periodic_settings(
        settings, {"x": {"task": TICK, "every": 60, "queue_name": "other", "priority": 9}}
    )
    assert list(task_backends["default"].check()) == []
    periodic = scheduler()
    periodic.run_due(at(10, 0))
    assert periodic.run_due(at(10, 1)) == ["x"]
    assert TaskRecord.objects.values_list("queue_name", "priority").get() == ("other", 9)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"queue_name": ""}, "['queue_name'] must be a queue name of 1 to 64"),
        ({"queue_name": "q\x00"}, "['queue_name'] must be a queue name"),
        ({"priority": 101}, "['priority'] must be a whole number from -100 to 100"),
        ({"priority": True}, "['priority'] must be a whole number"),
        ({"priority": 1.5}, "['priority'] must be a whole number"),
    ],
)
def test_bad_queue_or_priority_of_a_settings_entry(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError) as info:
        BackendOptions.parse("default", {"PERIODIC": {"x": {"task": TICK, "every": 5, **entry}}})
    assert message in str(info.value)
