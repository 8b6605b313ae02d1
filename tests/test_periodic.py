"""Periodic tasks: each slot enqueued once, whatever the number of workers or restarts."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections

from django_sqltasks.compat import task_backends
from django_sqltasks.models import ScheduleRecord, TaskRecord
from django_sqltasks.options import BackendOptions, OptionError
from django_sqltasks.periodic import Schedule, Scheduler
from tests.conftest import WorkerProcess, set_backend_options, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


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


def test_after_downtime_only_the_latest_missed_slot_fires(settings: Any) -> None:
    periodic_settings(settings, {"report": {"task": "tests.tasks.tick", "every": 60}})
    scheduler().run_due(at(10, 0))
    assert scheduler().run_due(at(12, 30, 10)) == ["report"]
    assert TaskRecord.objects.count() == 1
    assert ScheduleRecord.objects.get(name="report").last_slot == at(12, 30)


def test_arguments_are_passed(settings: Any) -> None:
    periodic_settings(
        settings,
        {"report": {"task": "tests.tasks.tick", "every": 60, "kwargs": {"label": "hourly"}}},
    )
    scheduler().run_due(at(10, 0))
    scheduler().run_due(at(10, 1))
    assert TaskRecord.objects.get().kwargs == {"label": "hourly"}


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


def test_workers_enqueue_each_slot_once(
    settings: Any, worker_process: Callable[..., WorkerProcess]
) -> None:
    periodic = {"tick": {"task": "tests.tasks.tick", "every": 1}}
    env = {"SQLTASKS_PERIODIC_EVERY": "1"}
    workers = [worker_process("--concurrency", "2", env=env) for _ in range(2)]
    periodic_settings(settings, periodic)
    wait_for(lambda: TaskRecord.objects.filter(task_path="tests.tasks.tick").count() >= 4)
    time.sleep(0.5)
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


@pytest.mark.parametrize(
    ("periodic", "message"),
    [
        ({"x": {"task": "tests.tasks.tick"}}, "needs exactly one of 'cron' and 'every'"),
        ({"x": {"task": "tests.tasks.tick", "cron": "nope"}}, "is not a valid cron expression"),
        ({"x": {"task": "tests.tasks.tick", "every": 0}}, "'every'] must be a positive number"),
        ({"x": {"task": "tick", "every": 5}}, "'task'] must be the dotted path"),
        ({"x": {"task": "tests.tasks.tick", "every": 5, "when": 1}}, "unknown key(s) when"),
        ("daily", "must be a dict of name -> schedule"),
    ],
)
def test_bad_schedules_are_refused_by_name(periodic: Any, message: str) -> None:
    with pytest.raises(OptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        BackendOptions.parse("default", {"PERIODIC": periodic})


def test_a_schedule_naming_a_non_task_is_a_check_error(settings: Any) -> None:
    periodic_settings(settings, {"x": {"task": "tests.tasks.NOT_A_TASK", "every": 5}})
    messages = list(task_backends["default"].check())
    assert [m.id for m in messages] == ["django_sqltasks.E005"]
