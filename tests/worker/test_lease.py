"""One worker id, one live worker: a second worker or supervisor given a live id is refused at
start with a clear message and exit status 78 (EX_CONFIG), and never takes the first one's tasks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord, WorkerRecord
from django_sqltasks.worker.lease import EXIT_ID_IN_USE
from tests import tasks_processes as tasks
from tests.conftest import ROOT, WorkerProcess, worker_env
from tests.events import ENV as EVENTS_ENV
from tests.events import EventLog, Gate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker_process]

StartWorker = Callable[..., WorkerProcess]
ENV = {"SQLTASKS_LEASE_TIMEOUT": "20", "SQLTASKS_HEARTBEAT_INTERVAL": "0.25"}


def _starts(marker: Path) -> list[str]:
    if not marker.exists():
        return []
    return [line for line in marker.read_text().splitlines() if line.startswith("start")]


def _registered(*worker_ids: str) -> bool:
    return WorkerRecord.objects.filter(id__in=worker_ids).count() == len(worker_ids)


def _wait_registered(events: EventLog, *worker_ids: str) -> None:
    for worker_id in worker_ids:
        events.wait("registered", worker_id=worker_id)


def test_a_second_supervisor_of_the_same_id_is_refused_and_takes_nothing(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    results = [tasks.record_at_gate.enqueue(str(marker), gate.path) for _ in range(8)]
    first = worker_process(
        "--processes", "2", "-c", "4", "--prefetch", "0", "--worker-id", "web", env=ENV
    )
    events.wait("note", what="start", count=8)  # each process runs four
    second = worker_process("--processes", "2", "-c", "4", "--worker-id", "web", env=ENV)
    assert second.wait(timeout=60) == EXIT_ID_IN_USE
    assert "--worker-id: 'web' is in use" in second.output
    assert "web-1" in second.output and "web-2" in second.output
    gate.open()
    for result in results:
        events.wait("task_finished", id=str(result.id), status=TaskResultStatus.SUCCESSFUL)
    assert len(_starts(marker)) == 8  # each ran once
    for record in TaskRecord.objects.filter(id__in=[r.id for r in results]):
        assert record.errors == [] and record.rescues == 0
    first.stop()


def test_a_supervisor_beside_a_single_worker_of_one_of_its_ids_is_refused(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    result = tasks.record_at_gate.enqueue(str(marker), gate.path)
    single = worker_process("-c", "4", "--worker-id", "web-1", env=ENV)
    events.wait("note", what="start")
    supervisor = worker_process("--processes", "2", "--worker-id", "web", env=ENV)
    assert supervisor.wait(timeout=60) == EXIT_ID_IN_USE
    assert "web-1" in supervisor.output
    gate.open()
    events.wait("task_finished", id=str(result.id), status=TaskResultStatus.SUCCESSFUL)
    record = TaskRecord.objects.get(id=result.id)
    assert record.errors == [] and len(_starts(marker)) == 1
    single.stop()


def test_a_single_worker_of_a_supervised_id_is_refused(
    worker_process: StartWorker, events: EventLog
) -> None:
    supervisor = worker_process("--processes", "2", "--worker-id", "web", env=ENV)
    _wait_registered(events, "web-1", "web-2")
    single = worker_process("--worker-id", "web-2", env=ENV)
    assert single.wait(timeout=60) == EXIT_ID_IN_USE
    assert "--worker-id: 'web-2' is in use by a live worker" in single.output
    assert _registered("web-1", "web-2")
    supervisor.stop()


def test_a_child_that_finds_its_id_taken_stops_its_supervisor(
    worker_process: StartWorker, events: EventLog, tmp_path: Path
) -> None:
    """The id of a process the supervisor starts later is taken after its check at start: the
    refused process exits with status 78, and its supervisor stops instead of restarting it,
    leaving the live worker's row alone."""
    marker = tmp_path / "ran"
    supervisor = worker_process(
        "--processes", "1", "--worker-id", "late", "--max-tasks-per-child", "1", env=ENV
    )
    _wait_registered(events, "late-1")
    single = worker_process("-Q", "other", "--worker-id", "late-2", env=ENV)
    _wait_registered(events, "late-2")
    # late-1 runs it, and is recycled: its replacement would be late-2.
    result = tasks.record.enqueue(str(marker))
    assert supervisor.wait(timeout=60) == EXIT_ID_IN_USE, supervisor.output
    assert "found its id in use" in supervisor.output
    assert TaskRecord.objects.get(id=result.id).status == TaskResultStatus.SUCCESSFUL
    assert WorkerRecord.objects.filter(id="late-2").exists()
    assert single.proc.poll() is None
    single.stop()


class Namespaced:
    """A worker in a PID namespace of its own (``unshare -p -f --mount-proc``): a container of
    this host, with this host name. It is killed with its ``unshare``."""

    def __init__(self, events: EventLog, log: Path, *args: str) -> None:
        env = worker_env(**ENV, **{EVENTS_ENV: events.path})
        argv = [sys.executable, "-m", "django", "tasks_worker", *args]
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                ["unshare", "-p", "-f", "--mount-proc", "--kill-child", *argv],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # --kill-child: the worker goes with it
            self.proc.wait()

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _unshare_problem() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(
        ["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True, check=False
    )
    if probe.returncode:
        return f"unshare -p cannot make a PID namespace here (root needed): {probe.stderr!r}"
    return None


def test_a_second_worker_of_one_id_in_another_pid_namespace_is_refused(
    events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    """Two containers of one host name given one --worker-id: the second cannot see the
    first's pid, which was reason enough to take its id over (and its tasks ran twice, each
    side's outcomes stored over the other's claims). It is refused: the first's row says it
    runs in another PID namespace, where a pid proves nothing."""
    problem = _unshare_problem()
    if problem is not None:
        pytest.skip(problem)
    marker = tmp_path / "ran"
    results = [tasks.record_at_gate.enqueue(str(marker), gate.path) for _ in range(4)]
    first = Namespaced(events, tmp_path / "first.log", "-c", "4", "--worker-id", "twin")
    second = None
    try:
        events.wait("note", what="start", count=4)
        second = Namespaced(events, tmp_path / "second.log", "-c", "4", "--worker-id", "twin")
        assert second.wait(timeout=60) == EXIT_ID_IN_USE, second.output
        assert "--worker-id: 'twin' is in use by a live worker" in second.output
        assert "in another PID namespace" in second.output
        gate.open()
        for result in results:
            events.wait("task_finished", id=str(result.id), status=TaskResultStatus.SUCCESSFUL)
        assert len(_starts(marker)) == 4  # each ran once
        for record in TaskRecord.objects.filter(id__in=[r.id for r in results]):
            assert record.errors == [] and record.rescues == 0 and record.attempts == 1
    finally:
        gate.open()
        first.stop()
        if second is not None:
            second.stop()
