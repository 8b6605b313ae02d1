"""``tasks_worker --processes N``: a supervisor of real worker processes, and what it promises."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from django_sqltasks.compat import TaskResultStatus, task_backends
from django_sqltasks.models import TaskRecord, WorkerRecord
from tests import tasks_processes as tasks
from tests.conftest import ROOT, WorkerProcess, wait_for
from tests.events import EventLog

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker_process]

StartWorker = Callable[..., WorkerProcess]
FAST = {"SQLTASKS_LEASE_TIMEOUT": "3", "SQLTASKS_HEARTBEAT_INTERVAL": "0.25"}


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def children(supervisor: WorkerProcess) -> list[int]:
    """Pids of the worker processes the supervisor said it started, in order."""
    return [int(pid) for pid in re.findall(r"Started worker process pid=(\d+)", supervisor.output)]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def start(worker_process: StartWorker, *args: str, **env: str) -> WorkerProcess:
    supervisor = worker_process("--processes", *args, env={**FAST, **env})
    return supervisor


def stop(supervisor: WorkerProcess) -> None:
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0, supervisor.output


def one_long_task(worker_process: StartWorker, marker: Path) -> tuple[Any, WorkerProcess]:
    """A supervisor of one process that has started a 60-second sync task."""
    result = tasks.record.enqueue(str(marker), 60)
    supervisor = start(worker_process, "1", "-c", "1")
    wait_for(lambda: lines(marker))
    return result, supervisor


def status(result: Any) -> str:
    return str(TaskRecord.objects.get(id=result.id).status)


def test_sigterm_stops_every_child_and_exits_zero(worker_process: StartWorker) -> None:
    supervisor = start(worker_process, "2", "-c", "2")
    wait_for(lambda: WorkerRecord.objects.count() == 2)
    pids = children(supervisor)
    assert len(pids) == 2 and all(map(alive, pids))
    ids = sorted(WorkerRecord.objects.values_list("id", flat=True))
    assert ids[0].endswith("-1") and ids[1].endswith("-2") and ids[0][:-2] == ids[1][:-2]
    stop(supervisor)
    assert not any(map(alive, pids)), "a worker process outlived its supervisor"
    assert not WorkerRecord.objects.exists()  # each child unregistered: a graceful stop


def test_children_die_with_a_sigkilled_supervisor(worker_process: StartWorker) -> None:
    supervisor = start(worker_process, "2", "-c", "1")
    wait_for(lambda: WorkerRecord.objects.count() == 2)
    pids = children(supervisor)
    supervisor.kill()
    supervisor.wait()
    wait_for(lambda: not any(map(alive, pids)), timeout=10)


def test_a_sigkilled_child_is_replaced_and_its_tasks_finish(
    worker_process: StartWorker, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    results = [tasks.record.enqueue(str(marker), 1.0) for _ in range(6)]
    supervisor = start(worker_process, "2", "-c", "2", "--prefetch", "0")
    wait_for(lambda: len(lines(marker)) >= 2)
    victim = int(lines(marker)[0].split()[1])
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: all(status(r) == TaskResultStatus.SUCCESSFUL for r in results), timeout=40)
    assert len(children(supervisor)) == 3, supervisor.output
    assert "exited with signal SIGKILL" in supervisor.output
    stop(supervisor)


def test_a_second_sigterm_forces_the_stop_and_requeues(
    worker_process: StartWorker, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    result, supervisor = one_long_task(worker_process, marker)
    pids = children(supervisor)
    supervisor.signal(signal.SIGTERM)
    time.sleep(0.5)
    assert supervisor.proc.poll() is None  # still waiting for the task
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=20) == 1, supervisor.output
    assert not any(map(alive, pids))
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.errors[-1].exception_class_path == "django_sqltasks.exceptions.WorkerStopped"


@pytest.mark.parametrize(
    ("task", "argument"),
    [
        (tasks.sleep_past_timeout, 30),
        (tasks.spin_past_timeout, 30),
        (tasks.hold_gil_past_timeout, 10**10),
    ],
    ids=["sleeping", "spinning", "holding-the-gil"],
)
def test_a_sync_task_past_its_timeout_is_stopped(
    worker_process: StartWorker, tmp_path: Path, task: Any, argument: Any
) -> None:
    marker, others = tmp_path / "marker", tmp_path / "others"
    stuck = task.enqueue(str(marker), argument)
    supervisor = start(worker_process, "1", "-c", "2")
    wait_for(lambda: lines(marker))
    started = time.monotonic()
    wait_for(lambda: status(stuck) == TaskResultStatus.FAILED, timeout=15)
    assert time.monotonic() - started < 5
    # The worker goes on with other tasks, in a new process.
    results = [tasks.record.enqueue(str(others)) for _ in range(3)]
    wait_for(lambda: all(status(r) == TaskResultStatus.SUCCESSFUL for r in results), timeout=30)
    stop(supervisor)
    stuck.refresh()
    assert stuck.attempts == 1
    assert [e.exception_class_path for e in stuck.errors] == [
        "django_sqltasks.exceptions.TaskTimeout"
    ]
    assert lines(marker) == [f"start {children(supervisor)[0]}"]  # ran once, never finished
    assert not alive(children(supervisor)[0])
    assert {line.split()[1] for line in lines(others)} == {str(children(supervisor)[1])}


def test_an_async_task_holding_the_gil_past_its_timeout_is_stopped(
    worker_process: StartWorker, tmp_path: Path
) -> None:
    """Its loop cannot cancel it: the supervisor stops the process ASYNC_GRACE later."""
    marker, others = tmp_path / "marker", tmp_path / "others"
    stuck = tasks.hold_gil_async_past_timeout.enqueue(str(marker), 10**10)
    supervisor = start(worker_process, "1", "-c", "2")
    wait_for(lambda: lines(marker))
    wait_for(lambda: status(stuck) == TaskResultStatus.FAILED, timeout=15)
    results = [tasks.record.enqueue(str(others)) for _ in range(3)]
    wait_for(lambda: all(status(r) == TaskResultStatus.SUCCESSFUL for r in results), timeout=30)
    stop(supervisor)
    stuck.refresh()
    assert stuck.attempts == 1
    assert [e.exception_class_path for e in stuck.errors] == [
        "django_sqltasks.exceptions.TaskTimeout"
    ]
    assert "its worker process was stopped" in stuck.errors[0].traceback
    assert lines(marker) == [f"start {children(supervisor)[0]}"]  # ran once, never finished
    assert {line.split()[1] for line in lines(others)} == {str(children(supervisor)[1])}


def test_an_async_task_past_its_timeout_is_cancelled_by_its_own_loop(
    worker_process: StartWorker, tmp_path: Path
) -> None:
    """An async task that yields is cancelled in its process, which lives on."""
    marker = tmp_path / "marker"
    result = tasks.await_past_timeout.enqueue(str(marker), 30)
    supervisor = start(worker_process, "1", "-c", "2")
    wait_for(lambda: status(result) == TaskResultStatus.FAILED, timeout=15)
    follower = tasks.record.enqueue(str(tmp_path / "other"))
    wait_for(lambda: status(follower) == TaskResultStatus.SUCCESSFUL, timeout=30)
    stop(supervisor)
    result.refresh()
    assert [e.exception_class_path for e in result.errors] == [
        "django_sqltasks.exceptions.TaskTimeout"
    ]
    assert "worker process was stopped" not in result.errors[0].traceback
    assert len(children(supervisor)) == 1, supervisor.output  # not replaced
    assert lines(marker) == [f"start {children(supervisor)[0]}"]


def test_a_timed_out_childs_other_tasks_are_released(
    worker_process: StartWorker, tmp_path: Path
) -> None:
    """Its other running tasks go back to the queue (WorkerStopped) and run again."""
    marker, other = tmp_path / "marker", tmp_path / "other"
    stuck = tasks.sleep_past_timeout.enqueue(str(marker), 30)
    bystander = tasks.record.enqueue(str(other), 3)
    supervisor = start(worker_process, "1", "-c", "2")
    wait_for(lambda: lines(marker) and lines(other))
    wait_for(lambda: status(bystander) == TaskResultStatus.SUCCESSFUL, timeout=30)
    stop(supervisor)
    bystander.refresh()
    assert status(stuck) == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in bystander.errors] == [
        "django_sqltasks.exceptions.WorkerStopped"
    ]
    assert [line.split()[0] for line in lines(other)] == ["start", "start", "end"]


def test_cancelling_a_running_sync_task_stops_it(
    worker_process: StartWorker, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    result, supervisor = one_long_task(worker_process, marker)
    assert task_backends["default"].cancel(result.id) is True
    wait_for(lambda: status(result) == TaskResultStatus.FAILED, timeout=10)
    result.refresh()
    assert result.errors[-1].exception_class_path == "django_sqltasks.exceptions.TaskCancelled"
    wait_for(lambda: WorkerRecord.objects.count() == 1)  # its replacement
    stop(supervisor)
    assert lines(marker) == [f"start {children(supervisor)[0]}"]


def test_a_child_is_recycled_after_max_tasks_per_child(
    worker_process: StartWorker, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    results = [tasks.record.enqueue(str(marker)) for _ in range(7)]
    supervisor = start(worker_process, "1", "-c", "1", "--max-tasks-per-child", "3")
    wait_for(lambda: all(status(r) == TaskResultStatus.SUCCESSFUL for r in results), timeout=40)
    stop(supervisor)
    runs: dict[str, int] = {}
    for line in lines(marker):
        if line.startswith("end"):
            runs[line.split()[1]] = runs.get(line.split()[1], 0) + 1
    assert sorted(runs.values()) == [1, 3, 3], runs
    assert "Recycling worker process" in supervisor.output
    assert "exited with" not in supervisor.output  # retired, not died


def test_a_child_is_recycled_above_max_memory_per_child(
    worker_process: StartWorker, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    supervisor = start(worker_process, "1", "-c", "1", "--max-memory-per-child", "150")
    wait_for(lambda: WorkerRecord.objects.count() == 1)
    tasks.grow.enqueue(200, str(marker))
    wait_for(lambda: len(children(supervisor)) == 2, timeout=20)
    first = children(supervisor)[0]
    wait_for(lambda: not alive(first), timeout=20)
    assert re.search(r"Recycling worker process pid=\d+ .*: it uses \d+ MB", supervisor.output)
    stop(supervisor)


@pytest.mark.parametrize("task", [tasks.hold_gil, tasks.hold_gil_async], ids=["sync", "async"])
def test_a_gil_holding_task_longer_than_the_lease_is_not_rescued(
    worker_process: StartWorker, tmp_path: Path, task: Any
) -> None:
    """The supervisor renews the stuck child's lease; its sibling would rescue it otherwise."""
    marker = tmp_path / "marker"
    result = task.enqueue(str(marker), 3 * 10**8)  # about 5 s: past the lease and its grace
    supervisor = start(
        worker_process,
        "2",
        "-c",
        "1",
        SQLTASKS_LEASE_TIMEOUT="1",
        SQLTASKS_HEARTBEAT_INTERVAL="0.1",
    )
    wait_for(lambda: status(result) == TaskResultStatus.SUCCESSFUL, timeout=60)
    stop(supervisor)
    result.refresh()
    assert result.attempts == 1 and result.errors == []
    assert [line.split()[0] for line in lines(marker)] == ["start", "end"]


def test_a_child_that_dies_at_start_is_restarted_with_backoff(
    worker_process: StartWorker, events: EventLog, tmp_path: Path
) -> None:
    health = tmp_path / "health"
    # Python runs sitecustomize at start: in each child (which has --supervisor), exit at once.
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\nif '--supervisor' in sys.argv:\n    os._exit(3)\n"
    )
    pythonpath = os.pathsep.join([str(tmp_path), str(ROOT)])
    supervisor = start(worker_process, "1", "--health-file", str(health), PYTHONPATH=pythonpath)
    deaths = events.wait("child_died", count=3)[:3]
    assert [death["status"] for death in deaths] == [3, 3, 3]
    assert [death["delay"] for death in deaths] == [0.0, 1.0, 2.0]
    # Not a hot loop: each restart came its delay after the death.
    restarts = events.wait("child_started", count=3)[1:3]
    for death, restart in zip(deaths[:2], restarts, strict=True):
        assert restart.at - death.at >= death["delay"] - 0.01, (death, restart)
    assert "exited with status 3" in supervisor.output
    assert not health.exists()  # never healthy
    stop(supervisor)
