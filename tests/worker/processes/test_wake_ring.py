"""The wake ring (PostgreSQL): the supervisors of several machines on one database share the
enqueue's notifications, so that one enqueue wakes one process of one machine, a machine with
no room passes the wake-up on, and a dead machine's place is taken."""

from __future__ import annotations

import contextlib
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from tests import tasks
from tests.conftest import WorkerProcess
from tests.events import EventLog, Gate

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY: PostgreSQL's"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker_process,
]

StartWorker = Callable[..., WorkerProcess]
POLL = {"SQLTASKS_POLL_INTERVAL": "30"}  # far longer than any wake-up the tests accept
SOON = 5.0  # seconds: a wake-up, not a poll (the ring's polls are 15 s apart at the least)


def machine(
    start: StartWorker, name: str, processes: int = 1, concurrency: int = 1
) -> WorkerProcess:
    return start(
        "--processes",
        str(processes),
        "--concurrency",
        str(concurrency),
        "--worker-id",
        name,
        env=POLL,
    )


def head_then_members(
    start: StartWorker,
    events: EventLog,
    names: list[str],
    processes: int = 1,
    concurrency: int = 1,
) -> list[WorkerProcess]:
    """Start the machine ``names[0]``, wait until it heads the ring, then the others; return
    once every process is up and the head knows every slot."""
    machines = [machine(start, names[0], processes, concurrency)]
    events.wait("relay_listening", head=True)
    machines += [machine(start, name, processes, concurrency) for name in names[1:]]
    events.wait("relay_listening", count=len(names))
    events.wait("worker_started", count=len(names) * processes)
    head = machines[0].proc.pid
    events.wait("ring_changed", lambda e: e.pid == head and len(e["slots"]) == len(names))
    return machines


@pytest.fixture
def gate() -> Iterator[Gate]:
    with tempfile.TemporaryDirectory() as directory:
        opened = Gate(str(Path(directory) / "gate"))
        yield opened
        opened.close()


def test_one_enqueue_wakes_one_process_of_one_machine(
    worker_process: StartWorker, events: EventLog
) -> None:
    # Room for more than one task a claim: a claim that takes one task asks for no other.
    head_then_members(worker_process, events, ["m0", "m1", "m2"], processes=2, concurrency=4)
    mark = events.mark()
    for _ in range(5):
        started = time.monotonic()
        result = tasks.noop.enqueue()
        events.wait("task_finished", id=str(result.id), timeout=SOON)
        assert time.monotonic() - started < SOON
    # One process woken a task, on the head: no other machine's supervisor heard the enqueues
    # (a wake-up of theirs would come before the next task's).
    woken = events.all("relay_woke", after=mark)
    assert len(woken) == 5, woken
    assert len({event.pid for event in woken}) == 1, woken
    assert not events.all("wake_passed", after=mark)


def test_a_machine_with_no_room_passes_the_wake_up_on(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    # The head first, alone, its only process busy; then another machine.
    head = machine(worker_process, "m0")
    events.wait("relay_listening", head=True)
    events.wait("worker_started")
    busy = tasks.touch_then_wait_at.enqueue(str(tmp_path / "busy"), gate.path)
    events.wait("note", what="start", path=str(tmp_path / "busy"))
    machine(worker_process, "m1")
    events.wait("relay_listening", count=2)
    events.wait("worker_started", count=2)
    events.wait("ring_changed", lambda e: e.pid == head.proc.pid and len(e["slots"]) == 2)
    mark = events.mark()
    started = time.monotonic()
    result = tasks.noop.enqueue()
    (finished,) = events.wait("task_finished", id=str(result.id), after=mark, timeout=SOON)
    assert time.monotonic() - started < SOON
    # The head's only process runs the first task: it passed the wake-up to the other machine.
    (passed,) = events.all("wake_passed", after=mark, queue="default")
    assert passed.pid == head.proc.pid and passed["hops"] == 1, passed
    assert finished["worker_ids"] == ["m1-1"], finished
    gate.open()
    events.wait("task_finished", id=str(busy.id), timeout=SOON)


def test_a_killed_machines_head_is_taken_over(
    worker_process: StartWorker, events: EventLog
) -> None:
    head, member = head_then_members(worker_process, events, ["m0", "m1"])
    mark = events.mark()
    head.kill()
    head.wait()
    events.wait("relay_head", lambda e: e.pid == member.proc.pid, after=mark, timeout=SOON)
    mark = events.mark()
    started = time.monotonic()
    result = tasks.noop.enqueue()
    (finished,) = events.wait("task_finished", id=str(result.id), after=mark, timeout=SOON)
    assert time.monotonic() - started < SOON
    assert finished["worker_ids"] == ["m1-1"], finished
    member.signal(signal.SIGTERM)
    assert member.wait() == 0, member.output


def test_a_listen_that_cannot_connect_blocks_neither_the_processes_nor_the_stop(
    worker_process: StartWorker, events: EventLog
) -> None:
    # A server that takes each connection and never answers: each try to listen waits out its
    # connect timeout (5 s), on a thread of its own.
    accepted: list[float] = []
    held: list[socket.socket] = []
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)

    def take() -> None:
        with contextlib.suppress(OSError):  # closed at the end
            while True:
                held.append(silent.accept()[0])
                accepted.append(time.monotonic())

    threading.Thread(target=take, daemon=True).start()
    try:
        worker = worker_process(
            "--processes",
            "1",
            "--concurrency",
            "1",
            env={
                "SQLTASKS_POLL_INTERVAL": "0.5",
                "SQLTASKS_TEST_LISTEN_PORT": str(silent.getsockname()[1]),
            },
        )
        (child,) = events.wait("child_started")
        result = tasks.noop.enqueue()  # found by the process's own poll: nobody listens
        events.wait("task_finished", id=str(result.id), timeout=SOON * 2)
        at = time.monotonic()
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output
        stopped = time.monotonic()
    finally:
        silent.close()
        for held_socket in held:
            held_socket.close()
    assert accepted, worker.output
    # The process started while the first try to connect waited, and the stop did not wait.
    assert child.at - accepted[0] < 4.0, (child.at - accepted[0], worker.output)
    assert stopped - at < 4.0, (stopped - at, worker.output)
    assert not events.all("relay_listening")
    assert "Traceback" not in worker.output, worker.output
