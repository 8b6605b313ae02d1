"""Periodic schedules stored in the database, with real workers: a schedule made in the admin is
picked up, a disable or a change holds from the next tick, settings' PERIODIC is synced in at a
worker's start, each slot is enqueued once, and a broken row fails alone."""

from __future__ import annotations

import logging
import re
import signal
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from django_sqltasks.compat import task_backends
from django_sqltasks.models import ScheduleRecord, TaskRecord
from django_sqltasks.store.control import database_now
from django_sqltasks.worker.scheduler import Scheduler
from tests.conftest import Gate, WorkerProcess, set_backend_options
from tests.events import EventLog
from tests.tasks_schedules import HOLD_ENV

TICK = "tests.tasks.tick"
HELD = "tests.tasks_schedules.held"
# Workers whose scheduler reads the table every 0.2 s when no slot comes sooner.
FAST = {"SQLTASKS_HEARTBEAT_INTERVAL": "0.2"}
StartWorker = Callable[..., WorkerProcess]


def admin_made(name: str, **fields: Any) -> ScheduleRecord:
    """A schedule as the admin page saves it."""
    fields.setdefault("task_path", TICK)
    return ScheduleRecord.objects.create(
        backend_name="default", name=name, origin=ScheduleRecord.ADMIN, **fields
    )


def edit(row: ScheduleRecord, **changes: Any) -> None:
    """Change a schedule as the admin page does: the fields, and the revision moved on."""
    ScheduleRecord.objects.filter(pk=row.pk).update(**changes, revision=F("revision") + 1)


def labels(path: str = TICK) -> list[str]:
    return [
        kwargs.get("label")
        for kwargs in TaskRecord.objects.filter(task_path=path).values_list("kwargs", flat=True)
    ]


def enqueued_slots(output: str, name: str) -> list[str]:
    """The slots a worker's log says it enqueued for schedule ``name``."""
    return re.findall(rf"Enqueued periodic task {re.escape(name)} for (\S+)", output)


def stop(*workers: WorkerProcess) -> None:
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.output


@pytest.mark.worker_process
@pytest.mark.django_db(transaction=True)
def test_a_schedule_made_in_the_admin_runs_and_a_disable_holds_from_the_next_tick(
    worker_process: StartWorker, events: EventLog
) -> None:
    worker = worker_process("--concurrency", "2", env=FAST)
    events.wait("scheduler_tick")  # running, with no schedule
    # Seen before (a last slot in the past): it fires at the next tick.
    long_ago = database_now("default") - timedelta(hours=1)
    row = admin_made("every-second", every=1, kwargs={"label": "made-in-admin"}, last_slot=long_ago)
    events.wait("task_finished", task=TICK, count=2)
    assert set(labels()) == {"made-in-admin"}
    edit(row, enabled=False)
    # A tick under way at the commit may have read the row before it; the next one has not.
    events.wait("scheduler_tick", count=2, after=events.mark())
    enqueued = len(labels())
    events.wait("scheduler_tick", count=7, after=events.mark())  # over a second: a slot
    assert len(labels()) == enqueued
    # Enabled again with other arguments: from the next tick, with no restart.
    edit(row, enabled=True, kwargs={"label": "changed"}, last_slot=long_ago)
    events.until(lambda: "changed" in labels(), "a task with the new arguments")
    stop(worker)
    row.refresh_from_db()
    assert row.last_task_id is not None and row.last_run_at is not None and row.last_error == ""


@pytest.mark.worker_process
@pytest.mark.django_db(transaction=True)
def test_settings_are_synced_at_a_workers_start(
    worker_process: StartWorker, events: EventLog
) -> None:
    retired = ScheduleRecord.objects.create(
        backend_name="default", name="retired", origin="settings", task_path=TICK, every=60
    )  # from settings, once
    renamed = admin_made("tick", every=30, enabled=False)  # settings now declare this name
    worker = worker_process(env={**FAST, "SQLTASKS_PERIODIC_EVERY": "1"})
    events.wait("scheduler_tick", count=2)
    stop(worker)
    retired.refresh_from_db()
    assert (retired.origin, retired.enabled) == (ScheduleRecord.REMOVED, False)
    renamed.refresh_from_db()
    assert (renamed.origin, renamed.every, renamed.enabled) == ("settings", 1.0, False)
    assert "no longer in OPTIONS['PERIODIC']" in worker.output
    assert "the settings' entry replaces it" in worker.output
    # 'tick' was disabled in the admin: the settings' entry took it over but not its 'enabled'.
    assert "Enqueued periodic task tick" not in worker.output


@pytest.mark.worker_process_core  # the slot election is written per database
@pytest.mark.django_db(transaction=True)
def test_two_workers_enqueue_an_admin_schedule_once_per_slot(
    worker_process: StartWorker, events: EventLog
) -> None:
    workers = [worker_process("--concurrency", "2", env=FAST) for _ in range(2)]
    events.wait("scheduler_tick", count=2)
    admin_made("both", every=1, kwargs={"label": "both"})
    events.wait("task_finished", task=TICK, count=3)
    stop(*workers)
    slots = [slot for w in workers for slot in enqueued_slots(w.output, "both")]
    assert len(slots) == len(set(slots)), sorted(slots)
    assert len(slots) == len(labels()) >= 3


@pytest.mark.worker_process
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_tick_leaves_its_slot_to_another(
    worker_process: StartWorker, events: EventLog, gate: Gate
) -> None:
    """Killed inside the election's transaction (its UPDATE and INSERT made, not committed):
    the slot is rolled back with them, and the next worker enqueues it, once."""
    now = database_now("default")
    row = admin_made("hourly", task_path=HELD, every=3600, last_slot=now - timedelta(hours=2))
    doomed = worker_process(env={**FAST, HOLD_ENV: gate.path})
    events.wait("note", what="enqueue_held")
    doomed.kill()
    doomed.wait()
    assert not TaskRecord.objects.filter(task_path=HELD).exists()
    row.refresh_from_db()
    assert row.last_slot == now - timedelta(hours=2)  # the election was rolled back
    heir = worker_process(env=FAST)
    events.wait("task_finished", task=HELD)
    events.wait("scheduler_tick", count=2, after=events.mark())
    stop(heir)
    assert enqueued_slots(doomed.output, "hourly") == []
    slots = enqueued_slots(heir.output, "hourly")
    assert len(slots) == 1 and TaskRecord.objects.filter(task_path=HELD).count() == 1
    row.refresh_from_db()
    assert row.last_slot == datetime.fromisoformat(slots[0])


# A broken row fails alone (no worker process: the scheduler of this one) ---------------------


def at(hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(2030, 1, 1, hour, minute, second, tzinfo=UTC)


@pytest.mark.django_db(transaction=True)
def test_rows_broken_by_sql_fail_alone_with_a_clear_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scheduler = Scheduler(task_backends["default"])
    old = at(9, 0)
    good = admin_made("good", every=60, last_slot=old)
    broken = {
        "bad-cron": admin_made("bad-cron", cron="61 * * * *", last_slot=old),
        "bad-zone": admin_made("bad-zone", cron="* * * * *", time_zone="Mars/Base", last_slot=old),
        "bad-every": admin_made("bad-every", every=-5, last_slot=old),
        "no-timing": admin_made("no-timing", last_slot=old),
        "both": admin_made("both", every=60, cron="* * * * *", last_slot=old),
        "args-object": admin_made("args-object", every=60, args={"a": 1}, last_slot=old),
        "bad-priority": admin_made("bad-priority", every=60, priority=1000, last_slot=old),
        "huge-every": admin_made("huge-every", every=1e300, last_slot=old),
    }
    if connection.vendor == "postgresql":  # the one of the three whose float column holds NaN
        broken["nan-every"] = admin_made("nan-every", every=float("nan"), last_slot=old)
    refused = {
        "gone": admin_made("gone", task_path="tests.tasks.renamed_since", every=60, last_slot=old),
        "misfit": admin_made("misfit", every=60, kwargs={"unexpected": 1}, last_slot=old),
        "no-queue": admin_made("no-queue", every=60, queue_name="nowhere", last_slot=old),
        "untrusted": admin_made("untrusted", task_path="this.s", every=60, last_slot=old),
        "bad-path": admin_made("bad-path", task_path="tests.tasks.ti ck", every=60, last_slot=old),
    }
    with caplog.at_level(logging.ERROR, logger="django_sqltasks"):
        assert scheduler.run_due(at(10, 0)) == ["good"]
        assert scheduler.next_wakeup(at(10, 0)) == at(10, 1)
    messages = {r.schedule: r.getMessage() for r in caplog.records}
    assert set(messages) == set(broken) | set(refused)
    assert "'cron'] is not a valid cron expression" in messages["bad-cron"]
    assert "must be an IANA time zone name" in messages["bad-zone"]
    for name in {"bad-every", "huge-every", "nan-every"} & set(broken):
        assert "'every'] must be a number of seconds" in messages[name], name
    assert "needs exactly one of 'cron' and 'every'" in messages["no-timing"]
    assert "'args' must be a list" in messages["args-object"]
    assert "'priority'] must be a whole number" in messages["bad-priority"]
    assert "does not import" in messages["gone"]
    assert "unexpected keyword argument" in messages["misfit"]
    assert "'nowhere'" in messages["no-queue"]
    assert "was not imported" in messages["untrusted"]
    assert "not a dotted path of Python names" in messages["bad-path"]
    # The refused ones spent their slot (logged once a slot, not once a tick) and say why.
    for name, row in refused.items():
        row.refresh_from_db()
        assert row.last_slot == at(10, 0) and row.last_error, name
    # The next tick: the broken ones are not logged again until they change; good goes on.
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="django_sqltasks"):
        assert scheduler.run_due(at(10, 0)) == []
        assert scheduler.run_due(at(10, 1)) == ["good"]
    assert {r.schedule for r in caplog.records} == set(refused)
    edit(broken["bad-cron"], cron="*/5 * * * *")
    assert scheduler.run_due(at(10, 5)) == ["bad-cron", "good"]  # fixed: it runs again
    good.refresh_from_db()
    assert good.last_slot == at(10, 5)
    assert TaskRecord.objects.filter(task_path=TICK).count() == 4


@pytest.mark.django_db(transaction=True)
def test_a_disable_committed_after_the_read_holds_for_the_election() -> None:
    """The election is guarded by 'enabled' and the revision: a tick that read the row before
    a disable or a change enqueues nothing."""
    scheduler = Scheduler(task_backends["default"])
    row = admin_made("guarded", every=60, last_slot=at(9, 0))
    due, _ = scheduler.read(at(10, 0), unseen=True)
    edit(row, enabled=False)
    assert scheduler._fire(due[0], at(10, 0)) is False
    edit(row, enabled=True)
    assert scheduler._fire(due[0], at(10, 0)) is False  # the revision moved on
    assert not TaskRecord.objects.exists()
    assert scheduler.run_due(at(10, 0)) == ["guarded"]


@pytest.mark.django_db(transaction=True)
def test_settings_sync_updates_and_restarts_a_changed_timing(settings: Any) -> None:
    set_backend_options(settings, PERIODIC={"s": {"task": TICK, "every": 60}})
    scheduler = Scheduler(task_backends["default"])
    scheduler.run_due(at(10, 0))
    assert ScheduleRecord.objects.get(name="s").last_slot == at(10, 0)
    set_backend_options(
        settings, PERIODIC={"s": {"task": TICK, "every": 120, "kwargs": {"label": "x"}}}
    )
    scheduler = Scheduler(task_backends["default"])  # a worker started with new settings
    assert scheduler.run_due(at(10, 3)) == []  # a new timing starts afresh, firing nothing
    row = ScheduleRecord.objects.get(name="s")
    assert (row.every, row.kwargs, row.last_slot, row.revision) == (
        120.0,
        {"label": "x"},
        at(10, 2),
        1,
    )
    assert scheduler.run_due(at(10, 4)) == ["s"]
    # The same settings again (another worker's start): nothing written.
    Scheduler(task_backends["default"]).sync()
    assert ScheduleRecord.objects.get(name="s").revision == 1


@pytest.mark.django_db(transaction=True)
def test_a_row_stored_before_the_upgrade_keeps_its_last_slot(settings: Any) -> None:
    """Rows of 0016 hold only the election (name, last slot): the sync fills in the rest and
    keeps the slot, so an upgrade neither fires a slot twice nor skips one."""
    ScheduleRecord.objects.create(
        backend_name="default", name="s", origin="settings", last_slot=at(10, 0)
    )
    set_backend_options(settings, PERIODIC={"s": {"task": TICK, "every": 60}})
    scheduler = Scheduler(task_backends["default"])
    assert scheduler.run_due(at(10, 0)) == []
    row = ScheduleRecord.objects.get(name="s")
    assert (row.task_path, row.every, row.last_slot) == (TICK, 60.0, at(10, 0))
    assert scheduler.run_due(at(10, 1)) == ["s"]


# A large table: a tick reads its due rows, not the table -----------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_tick_reads_only_the_due_rows_of_a_large_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With 1,500 hourly schedules, a tick between their slots checks no row and reads none:
    the scheduler used to read and check every enabled row at every tick (the table of a
    user's schedules starved the heartbeat on the same database thread)."""
    ScheduleRecord.objects.bulk_create(
        ScheduleRecord(
            backend_name="default", name=f"s{i:05}", task_path=TICK, cron=f"{i % 60} * * * *"
        )
        for i in range(1500)
    )
    from django_sqltasks.worker import scheduler as module  # to count the rows it checks

    checked: list[str] = []
    check = module.schedule_of

    def counting(row: ScheduleRecord, zone: str) -> Any:
        checked.append(row.name)
        return check(row, zone)

    monkeypatch.setattr(module, "schedule_of", counting)
    periodic = Scheduler(task_backends["default"])
    assert periodic.run_due(at(10, 0)) == []  # first sight of each: their next runs stored
    assert len(checked) == 1500
    checked.clear()
    with CaptureQueriesContext(connection) as queries:
        assert periodic.run_due(at(10, 0, 30)) == []
    assert checked == [] and len(queries) <= 3, [q["sql"] for q in queries]
    assert periodic.next_wakeup(at(10, 0, 30)) == at(10, 1)
    fired = periodic.run_due(at(10, 1, 30))  # the 25 of minute 1, in one batch
    assert fired == [f"s{i:05}" for i in range(1, 1500, 60)]
    assert TaskRecord.objects.filter(task_path=TICK).count() == 25


@pytest.mark.django_db(transaction=True)
def test_more_due_rows_than_a_batch_fire_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_sqltasks.worker import scheduler as module  # a small batch, to cross several

    monkeypatch.setattr(module, "BATCH", 7)
    monkeypatch.setattr(module, "UNSEEN_BATCH", 11)
    for i in range(30):
        admin_made(f"m{i:02}", every=60, last_slot=at(9, 0))
    broken = admin_made("broken", cron="61 * * * *", last_slot=at(9, 0))
    periodic = Scheduler(task_backends["default"])
    assert periodic.run_due(at(10, 0)) == [f"m{i:02}" for i in range(30)]
    assert periodic.run_due(at(10, 0, 30)) == []
    assert periodic.run_due(at(10, 1)) == [f"m{i:02}" for i in range(30)]
    assert TaskRecord.objects.filter(task_path=TICK).count() == 60
    broken.refresh_from_db()
    assert broken.next_run_at is None  # read at each tick until fixed, logged once


@pytest.mark.worker_process_core  # the tick's connection of its own is per database
@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_goes_on_while_a_tick_is_held(
    worker_process: StartWorker, events: EventLog, gate: Gate
) -> None:
    """The scheduler's tick runs on a connection of its own: held inside an election (an
    enqueue that blocks), it holds up no heartbeat and no rescue pass."""
    if connection.vendor == "sqlite":
        pytest.skip(
            "SQLite takes one writer at a time: the tick shares the database thread, a batch "
            "of rows per call (test_a_tick_reads_only_the_due_rows_of_a_large_table)"
        )
    now = database_now("default")
    admin_made("hourly", task_path=HELD, every=3600, last_slot=now - timedelta(hours=2))
    worker = worker_process(env={**FAST, HOLD_ENV: gate.path})
    events.wait("note", what="enqueue_held")
    mark = events.mark()
    events.wait("rescue_pass", count=3, after=mark)  # three heartbeats, 0.2 s apart
    gate.open()
    events.wait("task_finished", task=HELD)
    stop(worker)
    assert TaskRecord.objects.filter(task_path=HELD).count() == 1
