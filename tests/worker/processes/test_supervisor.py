"""``tasks_worker --processes N``: a supervisor of real worker processes, and what it promises."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from django_sqltasks.compat import TaskResultStatus, task_backends
from django_sqltasks.models import TaskRecord, WorkerRecord
from tests import tasks_processes as tasks
from tests.conftest import ROOT, WorkerProcess
from tests.events import EventLog, Gate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker_process]

StartWorker = Callable[..., WorkerProcess]
FAST = {"SQLTASKS_LEASE_TIMEOUT": "3", "SQLTASKS_HEARTBEAT_INTERVAL": "0.25"}


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def children(events: EventLog) -> list[int]:
    """Pids of the worker processes the supervisor started, in order."""
    return [event["pid"] for event in events.all("child_started")]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], timeout: float = 30) -> None:
    """Block until every process of ``pids`` has exited (its pidfd turns readable); fail
    after ``timeout`` seconds."""
    poller, handles = select.poll(), []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # gone, and reaped, already
            handles.append(os.pidfd_open(pid))
            poller.register(handles[-1], select.POLLIN)
    try:
        deadline = time.monotonic() + timeout
        waiting = set(handles)
        while waiting:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"processes still running after {timeout}s: {pids}"
            for fd, _ in poller.poll(remaining * 1000):
                poller.unregister(fd)
                waiting.discard(fd)
    finally:
        for fd in handles:
            os.close(fd)


def start(worker_process: StartWorker, *args: str, **env: str) -> WorkerProcess:
    supervisor = worker_process("--processes", *args, env={**FAST, **env})
    return supervisor


def stop(supervisor: WorkerProcess) -> None:
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0, supervisor.output


def one_long_task(
    worker_process: StartWorker, events: EventLog, gate: Gate, marker: Path
) -> tuple[Any, WorkerProcess]:
    """A supervisor of one process that has started a sync task, which waits at ``gate``."""
    result = tasks.record_at_gate.enqueue(str(marker), gate.path)
    supervisor = start(worker_process, "1", "-c", "1")
    events.wait("note", what="start")
    return result, supervisor


def status(result: Any) -> str:
    return str(TaskRecord.objects.get(id=result.id).status)


def succeeded(results: list[Any]) -> bool:
    ids = [result.id for result in results]
    done = TaskRecord.objects.filter(id__in=ids, status=TaskResultStatus.SUCCESSFUL)
    return done.count() == len(ids)


@pytest.mark.worker_process_core
def test_sigterm_stops_every_child_and_exits_zero(
    worker_process: StartWorker, events: EventLog
) -> None:
    supervisor = start(worker_process, "2", "-c", "2")
    events.wait("registered", count=2)
    pids = children(events)
    assert len(pids) == 2 and all(map(alive, pids))
    ids = sorted(WorkerRecord.objects.values_list("id", flat=True))
    assert ids[0].endswith("-1") and ids[1].endswith("-2") and ids[0][:-2] == ids[1][:-2]
    stop(supervisor)
    assert not any(map(alive, pids)), "a worker process outlived its supervisor"
    assert not WorkerRecord.objects.exists()  # each child unregistered: a graceful stop


def test_children_die_with_a_sigkilled_supervisor(
    worker_process: StartWorker, events: EventLog
) -> None:
    supervisor = start(worker_process, "2", "-c", "1")
    events.wait("registered", count=2)
    pids = children(events)
    supervisor.kill()
    supervisor.wait()
    wait_gone(pids, timeout=10)


@pytest.mark.worker_process_core
def test_a_sigkilled_child_is_replaced_and_its_tasks_finish(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    results = [tasks.record_at_gate.enqueue(str(marker), gate.path) for _ in range(6)]
    supervisor = start(worker_process, "2", "-c", "2", "--prefetch", "0")
    victim = events.wait("note", what="start", count=2)[0].pid
    os.kill(victim, signal.SIGKILL)
    events.wait("child_died", pid=victim)  # its tasks were rescued
    gate.open()
    events.until(lambda: succeeded(results), "every task to succeed")
    # The replacement is started (the other child may have run every task before it was).
    events.wait("child_started", count=3)
    assert len(children(events)) == 3, supervisor.output
    assert "exited with signal SIGKILL" in supervisor.output
    stop(supervisor)


def test_a_second_sigterm_forces_the_stop_and_requeues(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    result, supervisor = one_long_task(worker_process, events, gate, marker)
    pids = children(events)
    supervisor.signal(signal.SIGTERM)
    assert events.wait("stopping")[0]["running"] == 1  # the child waits for its task
    assert supervisor.proc.poll() is None
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=20) == 1, supervisor.output
    assert not any(map(alive, pids))
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.errors[-1].exception_class_path == "django_sqltasks.exceptions.WorkerStopped"


GATE = object()  # the argument is the test's gate, which never opens


@pytest.mark.parametrize(
    ("task", "argument"),
    [
        (tasks.sleep_past_timeout, 30),
        (tasks.spin_past_timeout, 30),
        (tasks.hold_gil_past_timeout, GATE),
    ],
    ids=["sleeping", "spinning", "holding-the-gil"],
)
def test_a_sync_task_past_its_timeout_is_stopped(
    worker_process: StartWorker,
    events: EventLog,
    gate: Gate,
    tmp_path: Path,
    task: Any,
    argument: Any,
) -> None:
    marker, others = tmp_path / "marker", tmp_path / "others"
    stuck = task.enqueue(str(marker), gate.path if argument is GATE else argument)
    supervisor = start(worker_process, "1", "-c", "2")
    started = events.wait("note", what="start")[0]
    killed = events.wait("child_killed", tasks=[str(stuck.id)])[0]  # and its outcome written
    assert killed.at - started.at < 5
    # The worker goes on with other tasks, in a new process.
    results = [tasks.record.enqueue(str(others)) for _ in range(3)]
    events.until(lambda: succeeded(results), "the other tasks to succeed")
    stop(supervisor)
    stuck.refresh()
    assert stuck.status == TaskResultStatus.FAILED
    assert stuck.attempts == 1
    assert [e.exception_class_path for e in stuck.errors] == [
        "django_sqltasks.exceptions.TaskTimeout"
    ]
    assert lines(marker) == [f"start {children(events)[0]}"]  # ran once, never finished
    assert not alive(children(events)[0])
    assert {line.split()[1] for line in lines(others)} == {str(children(events)[1])}


def test_an_async_task_holding_the_gil_past_its_timeout_is_stopped(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    """Its loop cannot cancel it: the supervisor stops the process ASYNC_GRACE later."""
    marker, others = tmp_path / "marker", tmp_path / "others"
    stuck = tasks.hold_gil_async_past_timeout.enqueue(str(marker), gate.path)
    supervisor = start(worker_process, "1", "-c", "2")
    events.wait("note", what="start")
    events.wait("child_killed", tasks=[str(stuck.id)])
    results = [tasks.record.enqueue(str(others)) for _ in range(3)]
    events.until(lambda: succeeded(results), "the other tasks to succeed")
    stop(supervisor)
    stuck.refresh()
    assert stuck.status == TaskResultStatus.FAILED
    assert stuck.attempts == 1
    assert [e.exception_class_path for e in stuck.errors] == [
        "django_sqltasks.exceptions.TaskTimeout"
    ]
    assert "its worker process was stopped" in stuck.errors[0].traceback
    assert lines(marker) == [f"start {children(events)[0]}"]  # ran once, never finished
    assert {line.split()[1] for line in lines(others)} == {str(children(events)[1])}


def test_an_async_task_past_its_timeout_is_cancelled_by_its_own_loop(
    worker_process: StartWorker, events: EventLog, tmp_path: Path
) -> None:
    """An async task that yields is cancelled in its process, which lives on."""
    marker = tmp_path / "marker"
    result = tasks.await_past_timeout.enqueue(str(marker), 30)
    supervisor = start(worker_process, "1", "-c", "2")
    events.wait("task_finished", id=str(result.id))
    follower = tasks.record.enqueue(str(tmp_path / "other"))
    events.wait("task_finished", id=str(follower.id), status=TaskResultStatus.SUCCESSFUL)
    stop(supervisor)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == [
        "django_sqltasks.exceptions.TaskTimeout"
    ]
    assert "worker process was stopped" not in result.errors[0].traceback
    assert len(children(events)) == 1, supervisor.output  # not replaced
    assert lines(marker) == [f"start {children(events)[0]}"]


def test_a_timed_out_childs_other_tasks_are_released(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    """Its other running tasks go back to the queue (WorkerStopped) and run again."""
    marker, other = tmp_path / "marker", tmp_path / "other"
    stuck = tasks.sleep_past_timeout.enqueue(str(marker), 30)
    bystander = tasks.record_at_gate.enqueue(str(other), gate.path)
    supervisor = start(worker_process, "1", "-c", "2")
    events.wait("note", what="start", count=2)
    events.wait("child_killed", tasks=[str(stuck.id)])
    gate.open()
    events.wait("task_finished", id=str(bystander.id))
    stop(supervisor)
    bystander.refresh()
    assert bystander.status == TaskResultStatus.SUCCESSFUL
    assert status(stuck) == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in bystander.errors] == [
        "django_sqltasks.exceptions.WorkerStopped"
    ]
    assert [line.split()[0] for line in lines(other)] == ["start", "start", "end"]


def test_cancelling_a_running_sync_task_stops_it(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    result, supervisor = one_long_task(worker_process, events, gate, marker)
    assert task_backends["default"].cancel(result.id) is True
    events.wait("child_killed", tasks=[str(result.id)], timeout=10)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "django_sqltasks.exceptions.TaskCancelled"
    events.wait("registered", count=2)  # its replacement
    stop(supervisor)
    assert lines(marker) == [f"start {children(events)[0]}"]


def test_a_child_is_recycled_after_max_tasks_per_child(
    worker_process: StartWorker, events: EventLog, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    results = [tasks.record.enqueue(str(marker)) for _ in range(7)]
    supervisor = start(worker_process, "1", "-c", "1", "--max-tasks-per-child", "3")
    events.until(lambda: succeeded(results), "every task to succeed")
    stop(supervisor)
    runs: dict[str, int] = {}
    for line in lines(marker):
        if line.startswith("end"):
            runs[line.split()[1]] = runs.get(line.split()[1], 0) + 1
    assert sorted(runs.values()) == [1, 3, 3], runs
    assert "Recycling worker process" in supervisor.output
    assert "exited with" not in supervisor.output  # retired, not died


def test_a_child_is_recycled_above_max_memory_per_child(
    worker_process: StartWorker, events: EventLog, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    supervisor = start(worker_process, "1", "-c", "1", "--max-memory-per-child", "150")
    events.wait("registered")
    tasks.grow.enqueue(200, str(marker))
    events.wait("child_started", count=2, timeout=20)
    wait_gone(children(events)[:1], timeout=20)
    assert re.search(r"Recycling worker process pid=\d+ .*: it uses \d+ MB", supervisor.output)
    stop(supervisor)


@pytest.mark.parametrize("task", [tasks.hold_gil, tasks.hold_gil_async], ids=["sync", "async"])
def test_a_gil_holding_task_longer_than_the_lease_is_not_rescued(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path, task: Any
) -> None:
    """The supervisor renews the stuck child's lease; its sibling would rescue it otherwise."""
    marker = tmp_path / "marker"
    result = task.enqueue(str(marker), gate.path)  # holds the GIL until the gate opens
    lease = 1.0
    supervisor = start(
        worker_process,
        "2",
        "-c",
        "1",
        SQLTASKS_LEASE_TIMEOUT=str(lease),
        SQLTASKS_HEARTBEAT_INTERVAL="0.1",
    )
    held = events.wait("note", what="start")[0]
    holder = events.wait("child_started", pid=held.pid)[0]["worker_id"]

    def watched_past_the_lease() -> bool:
        """Whether the sibling looked for dead workers' tasks two leases into the hold (or
        the task left its holder, which the assertion below tells)."""
        if TaskRecord.objects.get(id=result.id).owner != holder:
            return True
        return bool(
            events.all(
                "rescue_pass", lambda e: e["worker_id"] != holder and e.at > held.at + 2 * lease
            )
        )

    events.until(watched_past_the_lease, "the sibling's rescues two leases into the hold")
    record = TaskRecord.objects.get(id=result.id)
    assert (record.status, record.owner, record.rescues) == (TaskResultStatus.RUNNING, holder, 0)
    gate.open()
    events.wait("task_finished", id=str(result.id))
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 1 and result.errors == []
    assert [line.split()[0] for line in lines(marker)] == ["start", "end"]
    stop(supervisor)


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
