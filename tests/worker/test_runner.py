"""The worker, driven in-process in burst mode, on the test database."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_sqltasks import SQLTaskBackend
from django_sqltasks.compat import (
    TASKS_LOGGER,
    TaskResultStatus,
    logs_task_finished,
    task_finished,
    task_started,
)
from django_sqltasks.models import TaskRecord, WorkerRecord
from django_sqltasks.sql.rows import suspect_at
from django_sqltasks.worker import Worker
from django_sqltasks.worker import producer as producer_module
from django_sqltasks.worker.claims import Claims
from tests import tasks
from tests.conftest import run_burst_or_fail, set_backend_options, worker_thread
from tests.events import EventLog, Gate

pytestmark = pytest.mark.django_db(transaction=True)

RunWorker = Callable[..., Worker]


def test_sync_task_succeeds(run_worker: RunWorker) -> None:
    result = tasks.add.enqueue(2, 3)
    worker = run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.worker_ids == [worker.worker_id]
    assert result.attempts == 1
    assert result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    assert TaskRecord.objects.get(id=result.id).owner is None


def test_async_task_succeeds(run_worker: RunWorker) -> None:
    result = tasks.async_add.enqueue(2, 40)
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42


@pytest.mark.parametrize("task", [tasks.fail, tasks.async_fail])
def test_failing_task_records_class_and_traceback(run_worker: RunWorker, task: Any) -> None:
    result = task.enqueue("kaput")
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 1
    error = result.errors[0]
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "Traceback (most recent call last)" in error.traceback
    assert error.traceback.rstrip().endswith("ValueError: kaput")
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


@pytest.mark.parametrize(
    ("task", "exception_class"),
    [
        (tasks.raise_system_exit, "builtins.SystemExit"),
        (tasks.raise_keyboard_interrupt, "builtins.KeyboardInterrupt"),
    ],
)
def test_exit_exceptions_fail_the_task_not_the_worker(
    run_worker: RunWorker, task: Any, exception_class: str
) -> None:
    bad = task.enqueue()
    good = tasks.add.enqueue(1, 1)
    run_worker(concurrency=1)
    bad.refresh()
    good.refresh()
    assert bad.status == TaskResultStatus.FAILED
    assert bad.errors[0].exception_class_path == exception_class
    assert good.status == TaskResultStatus.SUCCESSFUL


def test_return_value_that_is_not_json_fails_the_task(run_worker: RunWorker) -> None:
    result = tasks.return_not_json.enqueue()
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == (
        "django_sqltasks.exceptions.InvalidReturnValue"
    )
    assert "Task return value['when'] is a builtins.object" in result.errors[0].traceback


def test_return_values_are_normalized(run_worker: RunWorker) -> None:
    result = tasks.echo.enqueue(1, "two", three=[3])
    run_worker()
    result.refresh()
    assert result.return_value == {"args": [1, "two"], "kwargs": {"three": [3]}}


@pytest.mark.parametrize("task", [tasks.context_info])
def test_takes_context_gets_its_task_result(run_worker: RunWorker, task: Any) -> None:
    result = task.enqueue("hello")
    run_worker()
    result.refresh()
    assert result.return_value == {"id": result.id, "attempt": 1, "label": "hello"}


def test_async_task_takes_context(run_worker: RunWorker) -> None:
    result = tasks.async_context_info.enqueue()
    run_worker()
    result.refresh()
    assert result.return_value == {"id": result.id, "attempt": 1}


def _insert_row(task_path: str) -> TaskRecord:
    return TaskRecord.objects.create(
        task_path=task_path, backend_name="default", queue_name="default"
    )


@pytest.mark.parametrize(
    ("task_path", "message"),
    [
        ("tests.tasks.NOT_A_TASK", "names an int, not a Task"),
        ("tests.tasks.missing_function", "does not import"),
        ("no_such_module.anything", "does not import"),
        ("os.path.join", "names a function, not a Task"),
    ],
)
def test_rows_that_do_not_name_a_task_fail_alone(
    run_worker: RunWorker, task_path: str, message: str
) -> None:
    record = _insert_row(task_path)
    good = tasks.add.enqueue(1, 2)
    run_worker()
    record.refresh_from_db()
    assert record.status == TaskResultStatus.FAILED
    assert record.errors[0]["exception_class_path"] == "django_sqltasks.exceptions.TaskNotFound"
    assert message in record.errors[0]["traceback"]
    assert record.finished_at is not None
    good.refresh()
    assert good.status == TaskResultStatus.SUCCESSFUL


def test_higher_priority_runs_first(run_worker: RunWorker) -> None:
    low = tasks.add.using(priority=-5).enqueue(0, 0)
    mid = tasks.add.enqueue(0, 1)
    high = tasks.add.using(priority=50).enqueue(0, 2)
    run_worker(concurrency=1)
    order = sorted([low, mid, high], key=lambda r: tasks.add.get_result(r.id).started_at)
    assert [r.id for r in order] == [high.id, mid.id, low.id]


def test_same_priority_runs_in_enqueue_order(run_worker: RunWorker) -> None:
    results = [tasks.add.enqueue(i, 0) for i in range(5)]
    run_worker(concurrency=1)
    started = [tasks.add.get_result(r.id).started_at for r in results]
    assert started == sorted(started)


def test_deferred_task_waits_for_run_after(run_worker: RunWorker) -> None:
    later = tasks.noop.using(run_after=timezone.now() + timedelta(hours=1)).enqueue()
    soon = tasks.noop.using(run_after=timezone.now() - timedelta(seconds=1)).enqueue()
    run_worker()
    assert tasks.noop.get_result(later.id).status == TaskResultStatus.READY
    assert tasks.noop.get_result(soon.id).status == TaskResultStatus.SUCCESSFUL


def test_deferred_task_runs_once_due(run_worker: RunWorker) -> None:
    result = tasks.noop.using(run_after=timezone.now() + timedelta(seconds=0.5)).enqueue()
    worker = Worker(queue_names=["*"], concurrency=2, poll_interval=0.05, max_tasks=1)
    started = time.monotonic()
    worker.run()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.started_at >= result.task.run_after
    assert time.monotonic() - started >= 0.4


def test_worker_only_takes_its_queues(run_worker: RunWorker) -> None:
    default = tasks.noop.enqueue()
    other = tasks.other_queue.enqueue()
    run_worker(queue_names=["other"])
    assert tasks.noop.get_result(default.id).status == TaskResultStatus.READY
    assert tasks.other_queue.get_result(other.id).status == TaskResultStatus.SUCCESSFUL
    run_worker(queue_names=["default"])
    assert tasks.noop.get_result(default.id).status == TaskResultStatus.SUCCESSFUL


def test_star_takes_every_queue(run_worker: RunWorker) -> None:
    results = [
        tasks.noop.enqueue(),
        tasks.other_queue.enqueue(),
        tasks.sleep.using(queue_name="slow").enqueue(0),
    ]
    run_worker(queue_names=["*"])
    assert all(
        TaskRecord.objects.get(id=r.id).status == TaskResultStatus.SUCCESSFUL for r in results
    )


def test_max_tasks_stops_after_that_many(run_worker: RunWorker) -> None:
    for i in range(5):
        tasks.add.enqueue(i, i)
    worker = run_worker(max_tasks=3, burst=False, concurrency=2)
    assert worker.claimed == 3
    assert TaskRecord.objects.succeeded().count() == 3
    assert TaskRecord.objects.ready().count() == 2


def test_prefetched_tasks_start_in_priority_order(run_worker: RunWorker, tmp_path: Path) -> None:
    log = tmp_path / "order"
    # Enqueued lowest priority first: the claim takes all four at once (one slot, three
    # prefetched), and must start them highest first, as four claims of one would.
    for priority in (-5, 0, 10, 50):
        tasks.record.using(priority=priority).enqueue(str(log), str(priority))
    worker = run_worker(concurrency=1, prefetch=3)
    assert worker.processed == 4
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["50", "10", "0", "-5"]


def test_prefetch_never_runs_more_than_the_concurrency(run_worker: RunWorker) -> None:
    tasks.running_count.most = 0
    for i in range(24):
        (tasks.counted if i % 2 else tasks.async_counted).enqueue(0.05)
    run_worker(concurrency=3, prefetch=6)
    assert TaskRecord.objects.succeeded().count() == 24
    assert tasks.running_count.most == 3


def test_sync_tasks_run_concurrently(run_worker: RunWorker) -> None:
    for _ in range(6):
        tasks.sleep.enqueue(0.5)
    started = time.monotonic()
    run_worker(concurrency=6)
    assert time.monotonic() - started < 2.5
    assert TaskRecord.objects.succeeded().count() == 6


def test_async_tasks_run_concurrently_on_the_loop(run_worker: RunWorker) -> None:
    for _ in range(20):
        tasks.async_sleep.enqueue(0.5)
    started = time.monotonic()
    run_worker(concurrency=20)
    assert time.monotonic() - started < 2.5
    assert TaskRecord.objects.succeeded().count() == 20


def test_signals_are_sent_with_the_backend_class(run_worker: RunWorker) -> None:
    events: list[tuple[str, Any, str, str]] = []

    def on_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        events.append(("started", sender, task_result.id, task_result.status))

    def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        exc = sys.exc_info()[1]
        events.append(("finished", sender, task_result.id, f"{task_result.status}:{exc!r}"))

    task_started.connect(on_started)
    task_finished.connect(on_finished)
    try:
        ok = tasks.add.enqueue(1, 2)
        bad = tasks.fail.enqueue("nope")
        bad_async = tasks.async_fail.enqueue("async nope")
        run_worker()
    finally:
        task_started.disconnect(on_started)
        task_finished.disconnect(on_finished)
    assert all(sender is SQLTaskBackend for _, sender, _, _ in events)
    by_id = {(kind, task_id): status for kind, _, task_id, status in events}
    assert by_id[("started", ok.id)] == TaskResultStatus.RUNNING
    assert by_id[("finished", ok.id)] == "SUCCESSFUL:None"
    # Failure receivers run inside the except block: sys.exc_info() holds the task's error.
    assert by_id[("finished", bad.id)] == "FAILED:ValueError('nope')"
    assert by_id[("finished", bad_async.id)] == "FAILED:ValueError('async nope')"


def test_an_async_tasks_start_is_logged_on_the_loop_and_a_receiver_runs_off_it(
    run_worker: RunWorker, caplog: pytest.LogCaptureFixture
) -> None:
    """With only Django's logging receiver, an async task's task_started is sent on the event
    loop, which starts the task at once (no hop to the signal thread and back); a receiver of
    the project's, which may query or wait, still runs on the signal thread."""
    caplog.set_level(logging.INFO, logger=TASKS_LOGGER)
    first = tasks.async_add.enqueue(1, 2)
    run_worker()
    started = [
        r for r in caplog.records if r.name == TASKS_LOGGER and "state=RUNNING" in r.getMessage()
    ]
    assert [r.threadName != "sqltasks-receiver" for r in started if first.id in r.getMessage()] == [
        True
    ]
    threads: list[str] = []

    def on_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        threads.append(threading.current_thread().name)

    task_started.connect(on_started)
    try:
        tasks.async_add.enqueue(3, 4)
        run_worker()
    finally:
        task_started.disconnect(on_started)
    assert threads == ["sqltasks-receiver"]


def test_task_finished_sees_the_stored_outcome(run_worker: RunWorker) -> None:
    seen: list[str] = []

    def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(TaskRecord.objects.get(id=task_result.id).status)

    task_finished.connect(on_finished)
    try:
        tasks.add.enqueue(1, 1)
        tasks.async_add.enqueue(1, 1)
        run_worker()
    finally:
        task_finished.disconnect(on_finished)
    assert seen == ["SUCCESSFUL", "SUCCESSFUL"]


def test_a_failing_signal_receiver_does_not_fail_the_task(
    run_worker: RunWorker, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    task_started.connect(broken)
    try:
        result = tasks.add.enqueue(1, 1)
        run_worker()
    finally:
        task_started.disconnect(broken)
    assert tasks.add.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    assert "receiver bug" in caplog.text


def test_tasks_can_use_the_orm(run_worker: RunWorker) -> None:
    result = tasks.count_rows.enqueue()
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 1


def test_worker_registers_and_unregisters(run_worker: RunWorker) -> None:
    seen: list[int] = []

    def on_started(sender: Any, **kwargs: Any) -> None:
        seen.append(WorkerRecord.objects.count())

    task_started.connect(on_started)
    try:
        tasks.noop.enqueue()
        run_worker()
    finally:
        task_started.disconnect(on_started)
    assert seen == [1]
    assert not WorkerRecord.objects.exists()


def test_logs_start_failures_and_debug_lines(
    run_worker: RunWorker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="django_sqltasks")
    ok = tasks.add.enqueue(1, 1)
    bad = tasks.fail.enqueue("logged")
    worker = run_worker()
    ours = [r for r in caplog.records if r.name == "django_sqltasks"]
    messages = [r.getMessage() for r in ours]
    assert any(f"Worker started worker_id={worker.worker_id}" in m for m in messages)
    assert any(f"Task id={ok.id}" in m and "SUCCESSFUL" in m for m in messages)
    # One record for the failure, with its traceback: Django's own receiver logs it, so the
    # worker does not log it again.
    failures = [r for r in caplog.records if r.exc_info and f"Task id={bad.id}" in r.getMessage()]
    assert len(failures) == 1
    (failure,) = failures
    assert failure.levelno == logging.ERROR and "FAILED" in failure.getMessage()
    assert failure.exc_info is not None and failure.exc_info[0] is ValueError
    _assert_starts_at_the_task(failure.exc_info[2])


def _assert_starts_at_the_task(tb: Any) -> None:
    """The traceback's first frame is the task's, not the worker's."""
    assert tb is not None
    assert tb.tb_frame.f_code.co_filename.endswith(os.path.join("tests", "tasks.py"))


@pytest.mark.parametrize("task", [tasks.fail, tasks.async_fail])
def test_without_djangos_receiver_the_worker_logs_the_failure_once(
    run_worker: RunWorker, caplog: pytest.LogCaptureFixture, task: Any
) -> None:
    caplog.set_level(logging.DEBUG)
    bad = task.enqueue("logged")
    assert task_finished.disconnect(logs_task_finished)
    try:
        run_worker()
    finally:
        task_finished.connect(logs_task_finished)
    failures = [r for r in caplog.records if r.exc_info and f"Task id={bad.id}" in r.getMessage()]
    assert [r.name for r in failures] == ["django_sqltasks"]
    assert failures[0].exc_info is not None
    _assert_starts_at_the_task(failures[0].exc_info[2])
    stored = TaskRecord.objects.get(id=bad.id).errors[-1]["traceback"]
    assert "django_sqltasks" not in stored, stored
    assert stored.startswith("Traceback (most recent call last):\n  File")


@pytest.mark.django_db(transaction=True)
def test_a_wake_up_between_a_claim_and_the_next_sleep_is_not_lost(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """A task enqueued and announced while the worker takes in what its claim found, or scans
    for limited tasks (both may await), is claimed at once. The sleep after them used to clear
    that wake-up, and the task waited for the next poll: 10 ms when busy, which made one probe
    in ten or twenty of the busy latency benchmark start 12-13 ms after its enqueue. Here the
    poll is an hour away, and so is the heartbeat (whose work may wake the loop too), so a lost
    wake-up cannot be missed."""
    set_backend_options(settings, HEARTBEAT_INTERVAL=3600, LEASE_TIMEOUT=7200)
    monkeypatch.setattr(producer_module, "BUSY_POLL", 3600.0)
    announced: list[str] = []
    scan = Claims.scan_limits

    def scan_while_a_task_arrives(self: Claims) -> None:
        if not announced:  # the first scan, after the first (empty) claim
            # enqueue() commits, then wakes this process's workers, from the database thread
            announced.append(tasks.add.enqueue(2, 3).id)
        scan(self)

    monkeypatch.setattr(Claims, "scan_limits", scan_while_a_task_arrives)
    finished = threading.Event()

    def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        if announced and task_result.id == announced[0]:
            finished.set()

    task_finished.connect(on_finished)
    worker = Worker(concurrency=2, queue_names=["*"], poll_interval=3600)
    try:
        with worker_thread(worker):
            assert finished.wait(30), "the task announced during the scan was not claimed"
            worker.stop()
    finally:
        task_finished.disconnect(on_finished)
    assert TaskRecord.objects.get(id=announced[0]).status == "SUCCESSFUL"


@pytest.mark.django_db(transaction=True)
def test_a_stop_asked_between_a_claim_and_the_next_sleep_is_not_lost(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """A stop asked while the worker scans for limited tasks after a claim ends the worker at
    once: the sleep after the scan used to clear its wake-up and wait a whole poll interval
    (here an hour) before seeing it."""
    set_backend_options(settings, HEARTBEAT_INTERVAL=3600, LEASE_TIMEOUT=7200)
    monkeypatch.setattr(producer_module, "BUSY_POLL", 3600.0)
    worker = Worker(concurrency=2, queue_names=["*"], poll_interval=3600)
    scan = Claims.scan_limits
    asked: list[bool] = []

    def scan_while_a_stop_is_asked(self: Claims) -> None:
        if not asked:
            asked.append(True)
            worker.stop()  # from the database thread, as a signal handler's would come
        scan(self)

    monkeypatch.setattr(Claims, "scan_limits", scan_while_a_stop_is_asked)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    runner.join(30)
    assert asked, "the worker never scanned"
    assert not runner.is_alive(), "the stop asked during the scan was not seen"


def test_worker_refuses_a_backend_of_another_kind() -> None:
    with pytest.raises(ValueError, match="is an ImmediateBackend, not a django_sqltasks SQLTask"):
        Worker(backend="immediate")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"concurrency": 0}, "concurrency must be at least 1"),
        ({"max_tasks": 0}, "max_tasks must be at least 1"),
        ({"prefetch": -1}, "prefetch must be 0 or more"),
        ({"worker_id": "x" * 65}, "worker_id must be 1 to 64 characters"),
    ],
)
def test_worker_checks_its_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Worker(**kwargs)


@pytest.mark.django_db(transaction=True)
def test_stopping_releases_claimed_tasks_that_have_not_started(
    tmp_path: Path, events: EventLog, gate: Gate
) -> None:
    paths = [tmp_path / f"t{i}" for i in range(4)]
    results = [tasks.touch_then_wait_at.enqueue(str(path), gate.path) for path in paths]
    worker = Worker(concurrency=4, queue_names=["*"])
    # No thread is added for waiting tasks: of the four claimed, two start and two wait.
    worker._threads.spawn_after = 3600
    with worker_thread(worker):
        events.wait("note", what="start", count=2, timeout=10)
        worker.stop()
        events.wait("stopping")
        gate.open()  # the two running tasks end after the stop
    statuses: dict[str, int] = {}
    for result, path in zip(results, paths, strict=True):
        record = TaskRecord.objects.get(id=result.id)
        statuses[record.status] = statuses.get(record.status, 0) + 1
        if record.status == TaskResultStatus.READY:
            assert not path.exists(), "a released task ran"
            assert record.owner is None
            assert "stopped before this task started" in record.errors[-1]["traceback"]
        else:
            assert record.status == TaskResultStatus.SUCCESSFUL and path.exists()
    assert statuses == {TaskResultStatus.SUCCESSFUL: 2, TaskResultStatus.READY: 2}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("task", [tasks.touch_then_wait_at, tasks.async_touch_then_wait_at])
def test_stopping_releases_prefetched_tasks(
    tmp_path: Path, events: EventLog, gate: Gate, task: Any
) -> None:
    paths = [tmp_path / f"t{i}" for i in range(3)]
    results = [task.enqueue(str(path), gate.path) for path in paths]
    worker = Worker(concurrency=1, prefetch=2, queue_names=["*"])
    with worker_thread(worker):
        events.wait("note", what="start")
        assert worker.claimed == 3  # one claim took all three
        worker.stop()
        events.wait("stopping")
        gate.open()
    records = [TaskRecord.objects.get(id=result.id) for result in results]
    assert [r.status for r in records].count(TaskResultStatus.SUCCESSFUL) == 1
    for record, path in zip(records, paths, strict=True):
        if record.status == TaskResultStatus.READY:
            assert not path.exists(), "a released task ran"
            assert record.owner is None
            assert "stopped before this task started" in record.errors[-1]["traceback"]


def _lost_task(rescues: int, *, alone: bool = False) -> TaskRecord:
    """A RUNNING task whose worker is gone, after ``rescues`` earlier rescues; ``alone``: it
    ran alone (a suspect), so its worker's death is charged to it (as it is when nothing ran
    beside it)."""
    return TaskRecord.objects.create(
        **({"available_at": suspect_at()} if alone else {}),
        task_path="tests.tasks.noop",
        backend_name="default",
        status=TaskResultStatus.RUNNING,
        owner="gone-worker",
        attempts=rescues + 1,
        worker_ids=["gone-worker"] * (rescues + 1),
        rescues=rescues,
        started_at=timezone.now(),
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("rescues", [0, 4])
@pytest.mark.parametrize("alone", [False, True])
def test_a_lost_task_goes_back_in_the_queue_and_runs(
    run_worker: RunWorker, rescues: int, alone: bool
) -> None:
    record = _lost_task(rescues, alone=alone)
    if not alone:
        _lost_task(0)  # ran beside it on the worker that died
    run_worker()  # registering rescues the tasks of dead workers
    record.refresh_from_db()
    assert record.status == TaskResultStatus.SUCCESSFUL
    # Charged only if it ran alone: beside others, any of them may have killed the worker.
    assert record.rescues == rescues + alone
    assert record.attempts == rescues + 2
    [error] = record.errors
    assert error["exception_class_path"] == "django_sqltasks.exceptions.WorkerLost"
    assert "Worker gone-worker stopped heartbeating" in error["traceback"]
    if alone:
        assert "it was put back in the queue." in error["traceback"]
    else:
        assert (
            "beside others; it was put back in the queue, to run beside the other tasks that "
            "lost a worker next time" in (error["traceback"])
        )


@pytest.mark.django_db(transaction=True)
def test_a_task_that_keeps_losing_its_worker_fails_after_max_rescues(
    run_worker: RunWorker,
) -> None:
    record = _lost_task(5, alone=True)  # MAX_RESCUES defaults to 5
    bystander = _lost_task(0)
    run_worker()
    record.refresh_from_db()
    assert record.status == TaskResultStatus.FAILED
    assert record.owner is None and record.finished_at is not None
    assert record.rescues == 6 and record.attempts == 6  # it did not run again
    [error] = record.errors
    assert error["exception_class_path"] == "django_sqltasks.exceptions.WorkerLost"
    assert "Worker gone-worker stopped heartbeating" in error["traceback"]
    assert "(MAX_RESCUES is 5), so it failed." in error["traceback"]
    bystander.refresh_from_db()
    assert bystander.status == TaskResultStatus.SUCCESSFUL


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("max_rescues", "status"), [(None, "SUCCESSFUL"), (0, "FAILED")])
def test_max_rescues_none_never_gives_up_and_zero_fails_at_once(
    run_worker: RunWorker, settings: Any, max_rescues: int | None, status: str
) -> None:
    set_backend_options(settings, MAX_RESCUES=max_rescues)
    record = _lost_task(0 if max_rescues == 0 else 50, alone=True)
    run_worker()
    record.refresh_from_db()
    assert record.status == status


@pytest.mark.django_db(transaction=True)
def test_a_stopping_worker_enqueues_no_more_periodic_tasks(
    settings: Any, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    set_backend_options(settings, PERIODIC={"tick": {"task": "tests.tasks.tick", "every": 1}})
    ticks = TaskRecord.objects.filter(task_path="tests.tasks.tick")
    long = tasks.touch_then_wait_at.enqueue(str(tmp_path / "long"), gate.path)
    worker = Worker(concurrency=2, queue_names=["*"])
    with worker_thread(worker):
        events.wait("task_finished", task="tests.tasks.tick")
        worker.stop()  # the long task keeps the worker running past the next slots
        events.wait("stopping")
        enqueued = ticks.count()
        events.wait("scheduling_stopped", timeout=10)
        assert TaskRecord.objects.get(id=long.id).status == TaskResultStatus.RUNNING
        assert ticks.count() == enqueued  # (the stop came just after a slot's tick ran)
        gate.open()


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="a worker told of new tasks (LISTEN) only polls"
)
def test_a_burst_worker_stops_as_its_last_task_ends_not_a_poll_interval_later() -> None:
    results = [tasks.noop.enqueue() for _ in range(3)]
    # A worker that slept its poll interval after its last task ended would run past the join.
    run_burst_or_fail(20, "the burst worker outlived its last task", poll_interval=120)
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
