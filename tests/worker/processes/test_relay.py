"""The connection budget on PostgreSQL: two connections of its own per worker process, and under
``--processes N`` one ``LISTEN`` for the machine, the supervisor's, which wakes its children."""

from __future__ import annotations

import os
import signal
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection

from tests import tasks
from tests.conftest import WORKER_APPLICATION_NAME, WorkerProcess
from tests.events import EventLog

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY: PostgreSQL's"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker_process,
]

StartWorker = Callable[..., WorkerProcess]
OWN = 2  # connections of its own a worker process holds (docs/worker.md)
POLL = "30"  # seconds: far longer than any wake-up the tests accept


def sessions() -> list[tuple[int | None, str]]:
    """The worker sessions on the test database: each one's client port and last statement."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT client_port, query FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            [WORKER_APPLICATION_NAME],
        )
        return [(port, query) for port, query in cursor.fetchall()]


def by_process(pids: list[int]) -> Counter[int]:
    """The worker sessions held by each of ``pids``: each session's client port is the local
    port of one of their TCP sockets (Linux's /proc)."""
    ports = {port for port, _ in sessions()}
    assert None not in ports, "the test database must be reached over TCP"
    inodes = {}  # socket inode: local port
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            inodes[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    counts: Counter[int] = Counter()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except FileNotFoundError:  # closed meanwhile
                continue
            if target.startswith("socket:[") and inodes.get(target[8:-1]) in ports:
                counts[pid] += 1
    return counts


def listening_sessions() -> int:
    return sum(1 for _, query in sessions() if query.strip().upper().startswith("LISTEN"))


def start_latencies(count: int, events: EventLog) -> list[float]:
    """Enqueue ``count`` tasks one at a time; each one's enqueue-to-start, in seconds."""
    timings = []
    for _ in range(count):
        started = time.time()
        result = tasks.clock.enqueue()
        events.wait("task_finished", id=str(result.id), timeout=20)
        timings.append(tasks.clock.get_result(result.id).return_value - started)
    return timings


def test_a_worker_holds_two_connections_of_its_own(
    worker_process: StartWorker, events: EventLog
) -> None:
    worker = worker_process("--concurrency", "10", env={"SQLTASKS_POLL_INTERVAL": POLL})
    events.wait("worker_started")
    timings = start_latencies(5, events)  # its outcomes written, its heartbeat and ticks run
    events.wait("scheduler_tick", count=2)
    held = by_process([worker.proc.pid])
    assert sum(held.values()) <= OWN, (held, sessions())
    assert max(timings) < 2.0, timings  # woken by its own LISTEN (which also claims)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output


def test_the_supervisor_listens_for_its_processes_and_wakes_them(
    worker_process: StartWorker, events: EventLog
) -> None:
    worker = worker_process(
        "--processes", "3", "--concurrency", "10", env={"SQLTASKS_POLL_INTERVAL": POLL}
    )
    events.wait("worker_started", count=3)
    events.wait("relay_listening")
    # A first task: each process has claimed at least once since it started.
    events.wait("task_finished", id=str(tasks.noop.enqueue().id), timeout=40)
    timings = start_latencies(20, events)
    events.wait("scheduler_tick", count=6)
    held = by_process([worker.proc.pid, *(e["pid"] for e in events.all("child_started"))])
    # One LISTEN for the machine: the supervisor's; no child listens.
    assert listening_sessions() == 1, sessions()
    assert len(held) == 4, held  # the supervisor and its three children
    assert max(held.values()) <= OWN, held
    assert sum(held.values()) <= OWN * 3 + 2, (held, sessions())
    # Woken through the supervisor, far sooner than the 30 s poll.
    assert statistics.median(timings) < 0.3, timings
    assert max(timings) < 2.0, timings
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    assert "Traceback" not in worker.output, worker.output
