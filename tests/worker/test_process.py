"""Real ``tasks_worker`` processes: signals, crashes, and several workers on one queue."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord, WorkerRecord
from tests import tasks
from tests.conftest import WORKER_APPLICATION_NAME, WorkerProcess, expire_lease
from tests.events import EventLog, Gate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker_process]

StartWorker = Callable[..., WorkerProcess]


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.worker_process_core
def test_burst_runs_everything_and_exits_zero(worker_process: StartWorker) -> None:
    results = [tasks.add.enqueue(i, i) for i in range(20)]
    worker = worker_process("--burst", "--queue", "*", "--concurrency", "5")
    assert worker.wait() == 0, worker.output
    assert "Worker started" in worker.output
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    assert not WorkerRecord.objects.exists()


@pytest.mark.worker_process_core
def test_sigterm_lets_the_running_task_finish(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    running = tasks.touch_then_wait_at.enqueue(str(marker), gate.path)
    worker = worker_process("--concurrency", "1")
    events.wait("note", what="start")
    queued = tasks.noop.enqueue()
    worker.signal(signal.SIGTERM)
    assert events.wait("stopping")[0]["running"] == 1
    gate.open()  # the task ends after the stop began
    assert worker.wait() == 0, worker.output
    running.refresh()
    assert running.status == TaskResultStatus.SUCCESSFUL
    # Nothing new is claimed once stopping.
    assert tasks.noop.get_result(queued.id).status == TaskResultStatus.READY
    assert "Received SIGTERM" in worker.output


@pytest.mark.worker_process_core
def test_second_sigint_stops_at_once_and_requeues(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    result = tasks.touch_then_wait_at.enqueue(str(marker), gate.path)
    worker = worker_process("--concurrency", "1")
    events.wait("note", what="start")
    worker.signal(signal.SIGINT)
    events.wait("stopping")
    worker.signal(signal.SIGINT)
    assert worker.wait(timeout=15) != 0
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.attempts == 1
    assert result.errors[-1].exception_class_path == "django_sqltasks.exceptions.WorkerStopped"
    assert TaskRecord.objects.get(id=result.id).owner is None


@pytest.mark.parametrize("task", [tasks.touch_then_sleep, tasks.async_touch_then_sleep])
def test_shutdown_timeout_requeues_what_is_still_running(
    worker_process: StartWorker, events: EventLog, tmp_path: Path, task: Any
) -> None:
    marker = tmp_path / "marker"
    result = task.enqueue(str(marker), 60)
    worker = worker_process("--concurrency", "2", "--shutdown-timeout", "0.5")
    events.wait("note", what="start")
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0, worker.output
    assert time.monotonic() - started < 10
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.errors[-1].exception_class_path == "django_sqltasks.exceptions.WorkerStopped"
    assert "Shutdown timeout: requeueing 1 running task(s)" in worker.output


@pytest.mark.worker_process_core
def test_sigkilled_worker_tasks_are_rescued_after_the_lease(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    result = tasks.touch_then_wait_at.enqueue(str(marker), gate.path)
    victim = worker_process("--concurrency", "1", "--worker-id", "victim")
    events.wait("note", what="start")
    victim.kill()
    victim.wait()
    assert TaskRecord.objects.get(id=result.id).status == TaskResultStatus.RUNNING
    beat = {"SQLTASKS_HEARTBEAT_INTERVAL": "0.25"}
    rescuer = worker_process("--concurrency", "1", "--worker-id", "rescuer", env=beat)
    # Its lease is 30 s: the live one is left alone, until its heartbeat is an hour old.
    events.wait("rescue_pass", worker_id="rescuer")
    assert TaskRecord.objects.get(id=result.id).owner == "victim"
    expire_lease("victim")
    gate.open()
    events.wait("task_finished", id=str(result.id))
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait() == 0
    result.refresh()
    assert result.worker_ids == ["victim", "rescuer"]
    assert result.attempts == 2
    assert [e.exception_class_path for e in result.errors] == [
        "django_sqltasks.exceptions.WorkerLost"
    ]
    assert "Worker victim stopped heartbeating" in result.errors[0].traceback
    assert len(lines(marker)) == 2
    assert not WorkerRecord.objects.filter(id="victim").exists()


@pytest.mark.worker_process_core
@pytest.mark.parametrize("workers", [2, 4])
def test_concurrent_workers_never_run_a_task_twice(
    worker_process: StartWorker, events: EventLog, tmp_path: Path, workers: int
) -> None:
    log = tmp_path / "executions"
    count = 400
    started = [worker_process("--concurrency", "8", "--worker-id", f"w{n}") for n in range(workers)]
    events.wait("worker_started", count=workers)
    for i in range(count):
        tasks.record.enqueue(str(log), f"task-{i}")
    events.wait("task_finished", count=count, timeout=120)
    for worker in started:
        worker.signal(signal.SIGTERM)
    for worker in started:
        assert worker.wait(timeout=60) == 0, worker.output
    executions = Counter(line.split()[0] for line in lines(log))
    assert len(executions) == count
    assert max(executions.values()) == 1
    assert TaskRecord.objects.succeeded().count() == count
    owners = Counter(
        wid for ids in TaskRecord.objects.values_list("worker_ids", flat=True) for wid in ids
    )
    assert sum(owners.values()) == count
    pids = {line.split()[1] for line in lines(log)}
    assert len(pids) >= 2, "expected the work to be shared between processes"


def test_a_crashing_task_does_not_take_the_worker_down(worker_process: StartWorker) -> None:
    bad = [tasks.raise_system_exit.enqueue(), tasks.raise_keyboard_interrupt.enqueue()]
    good = tasks.add.enqueue(1, 2)
    worker = worker_process("--burst", "--concurrency", "1")
    assert worker.wait() == 0, worker.output
    for result in bad:
        assert tasks.noop.get_backend().get_result(result.id).status == TaskResultStatus.FAILED
    assert tasks.add.get_result(good.id).return_value == 3


@pytest.mark.skipif(connection.vendor != "postgresql", reason="pg_terminate_backend")
def test_worker_survives_its_connections_being_killed(
    worker_process: StartWorker, events: EventLog, tmp_path: Path
) -> None:
    log = tmp_path / "executions"
    count = 200
    for i in range(count):
        tasks.record.enqueue(str(log), f"task-{i}", 0.01)
    worker = worker_process("--concurrency", "4", "--worker-id", "victim")
    for kill in range(1, 4):
        # Each time 20 more tasks have finished since the last kill.
        events.wait("task_finished", count=20 * kill)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = %s",
                [WORKER_APPLICATION_NAME],
            )
    events.wait("task_finished", count=count, timeout=90)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    executions = Counter(line.split()[0] for line in lines(log))
    assert len(executions) == count
    assert max(executions.values()) == 1, [k for k, v in executions.items() if v > 1]
    assert "Transient database error" in worker.output


@pytest.mark.worker_process_core
@pytest.mark.skipif(
    connection.vendor == "mysql", reason="MySQL has no wake-up channel; its workers poll"
)
def test_an_idle_worker_wakes_up_on_enqueue(worker_process: StartWorker, events: EventLog) -> None:
    worker = worker_process("--concurrency", "2", env={"SQLTASKS_POLL_INTERVAL": "30"})
    events.wait("worker_started")
    # The worker has claimed (this task, or nothing) at least once since it started: every
    # task below comes while it waits (or while it claims again after a task).
    events.wait("task_finished", id=str(tasks.noop.enqueue().id), timeout=40)
    timings = []
    for _ in range(5):
        started = time.time()
        result = tasks.clock.enqueue()
        events.wait("task_finished", id=str(result.id), timeout=10)
        timings.append(tasks.clock.get_result(result.id).return_value - started)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    # Far below the 30 s poll interval: the enqueue woke the worker.
    assert max(timings) < 2.0, timings


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "--concurrency: must be at least 1"),
        (["--concurrency", "many"], "--concurrency: must be a whole number"),
        (["--max-tasks", "-3"], "--max-tasks: must be at least 1"),
        (["--poll-interval", "nan"], "--poll-interval: must be a positive, finite number"),
        (["--worker-id", "x" * 65], "--worker-id: a worker id must be 1 to 64 characters"),
        (["--backend", "nope"], "--backend"),
        (["--backend", "immediate"], "not a django_sqltasks SQLTaskBackend"),
    ],
)
def test_bad_options_are_refused_with_a_clear_message(
    worker_process: StartWorker, args: list[str], message: str
) -> None:
    worker = worker_process(*args)
    assert worker.wait() != 0
    assert message in worker.output
