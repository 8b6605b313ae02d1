"""The embedded worker: a normal worker (lease, heartbeat, claim) on a thread of the web
server's process, started and stopped with it: by an ASGI server's lifespan, and in
``runserver``'s process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections

from django_sqltasks import EmbeddedWorker, embed_in_asgi
from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.embedded import STOP_JOIN_MARGIN
from django_sqltasks.models import TaskRecord, WorkerRecord
from tests import tasks
from tests.conftest import ROOT, worker_env
from tests.events import ENV as EVENTS_ENV
from tests.events import EventLog


async def http_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A web application that answers every request with 204."""
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


class Lifespan:
    """An ASGI server's side of the lifespan protocol, run against an application."""

    def __init__(self, application: Any) -> None:
        self.application = application
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    async def send(self, message_type: str) -> dict[str, Any]:
        if self.task is None:
            scope = {"type": "lifespan", "asgi": {"version": "3.0"}}
            self.task = asyncio.create_task(
                self.application(scope, self.inbox.get, self.outbox.put)
            )
        await self.inbox.put({"type": message_type})
        return await asyncio.wait_for(self.outbox.get(), timeout=60)


@pytest.mark.django_db(transaction=True)
async def test_an_asgi_lifespan_runs_a_worker_from_startup_to_shutdown(events: EventLog) -> None:
    application = embed_in_asgi(http_app, concurrency=2)
    server = Lifespan(application)
    assert (await server.send("lifespan.startup"))["type"] == "lifespan.startup.complete"
    worker_id = application.worker.worker.worker_id
    await asyncio.to_thread(events.wait, "worker_started", worker_id=worker_id)
    # A normal worker: its row, its lease.
    assert await WorkerRecord.objects.filter(id=worker_id).aexists()

    result = await sync_to_async(tasks.add.enqueue)(2, 3)
    await asyncio.to_thread(
        events.wait, "task_finished", id=str(result.id), status=TaskResultStatus.SUCCESSFUL
    )
    await result.arefresh()
    assert result.return_value == 5
    record = await TaskRecord.objects.aget(id=result.id)
    assert record.worker_ids == [worker_id]

    # Requests go to the application while the worker runs.
    sent: list[dict[str, Any]] = []

    async def collect(message: dict[str, Any]) -> None:
        sent.append(message)

    await application({"type": "http"}, asyncio.Queue().get, collect)
    assert sent[0]["status"] == 204

    assert (await server.send("lifespan.shutdown"))["type"] == "lifespan.shutdown.complete"
    assert not application.worker.running
    # A clean stop: the worker unregistered, as tasks_worker does on SIGTERM.
    assert not await WorkerRecord.objects.filter(id=worker_id).aexists()


@pytest.mark.django_db(transaction=True)
def test_a_stop_gives_running_tasks_the_shutdown_timeout_then_puts_them_back(
    events: EventLog, tmp_path: Path
) -> None:
    embedded = EmbeddedWorker(concurrency=1, shutdown_timeout=0.2)
    embedded.start()
    marker = str(tmp_path / "started")
    result = tasks.async_touch_then_sleep.enqueue(marker, 60)
    events.wait("note", what="start", path=marker)
    worker_id = embedded.worker.worker_id
    assert embedded.stop()
    record = TaskRecord.objects.get(id=result.id)
    assert record.status == TaskResultStatus.READY  # put back for another worker
    assert not WorkerRecord.objects.filter(id=worker_id).exists()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# ``python -m django`` as a shell in a terminal starts it: SIGINT delivered and handled
# (KeyboardInterrupt). A process inherits an ignored or blocked signal from the one that
# started it (a CI job's background shell, a test runner's worker), and Python then installs
# no handler: runserver would not see the Ctrl-C this test sends.
AS_FROM_A_TERMINAL = (
    "import runpy, signal, sys; "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'django'; "
    "runpy.run_module('django', run_name='__main__', alter_sys=True)"
)


def signal_dispositions(pid: int) -> str:
    """The ignored and blocked signal masks of process ``pid`` (Linux), for a failure's text."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return ", ".join(
                line.strip() for line in status if line.startswith(("SigIgn", "SigBlk"))
            )
    except OSError:
        return "no /proc"


@pytest.mark.worker_process
@pytest.mark.django_db(transaction=True)
def test_runserver_runs_tasks_in_its_process_and_stops_its_worker_on_ctrl_c(
    events: EventLog,
) -> None:
    env = worker_env(DJANGO_SETTINGS_MODULE="tests.settings_embedded", **{EVENTS_ENV: events.path})
    env["PYTHONFAULTHANDLER"] = "1"  # a server that does not stop prints its threads on SIGABRT
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            AS_FROM_A_TERMINAL,
            "runserver",
            "--noreload",
            f"127.0.0.1:{free_port()}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        [started] = events.wait("worker_started")
        assert started.pid == server.pid  # in runserver's own process
        result = tasks.add.enqueue(4, 5)
        events.wait("task_finished", id=str(result.id), status=TaskResultStatus.SUCCESSFUL)
        result.refresh()
        assert result.return_value == 9
        assert TaskRecord.objects.get(id=result.id).worker_ids == [started["worker_id"]]
        dispositions = signal_dispositions(server.pid)
        server.send_signal(signal.SIGINT)
        try:
            output, _ = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            # Where each thread is (faulthandler), to say what held the exit up.
            server.send_signal(signal.SIGABRT)
            output, _ = server.communicate(timeout=30)
            pytest.fail(f"runserver did not stop within 60 s of SIGINT ({dispositions}):\n{output}")
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert "Traceback" not in output, output
    assert "Worker stopped worker_id=" in output, output
    assert not WorkerRecord.objects.filter(id=started["worker_id"]).exists()


class Waits(logging.Handler):
    """Sets ``seen`` when the embedded worker logs that it cannot start yet."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "action", None) == "embedded_worker_wait":
            self.seen.set()


@contextlib.contextmanager
def database_refused() -> Iterator[Waits]:
    """New connections of the default alias go to a port where nothing listens (every
    connection of the alias reads the one settings dict), until the block ends."""
    config = connections.settings["default"]
    port = config["PORT"]
    config["PORT"] = free_port()
    waits = Waits()
    logger = logging.getLogger("django_sqltasks")
    logger.addHandler(waits)
    try:
        yield waits
    finally:
        config["PORT"] = port
        logger.removeHandler(waits)


postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="a refused connection: a server's port"
)


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_an_embedded_worker_started_before_its_database_runs_tasks_once_it_is_up(
    events: EventLog,
) -> None:
    embedded = EmbeddedWorker(concurrency=1)
    try:
        with database_refused() as waits:
            embedded.start()
            assert waits.seen.wait(60), "no attempt logged"
            assert embedded.running  # waiting, not given up
        [started] = events.wait("worker_started")
        result = tasks.add.enqueue(20, 22)
        events.wait("task_finished", id=str(result.id), status=TaskResultStatus.SUCCESSFUL)
        assert TaskRecord.objects.get(id=result.id).worker_ids == [started["worker_id"]]
    finally:
        assert embedded.stop()


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_an_embedded_worker_waiting_for_its_database_stops_at_once() -> None:
    embedded = EmbeddedWorker(concurrency=1)
    with database_refused() as waits:
        embedded.start()
        assert waits.seen.wait(60), "no attempt logged"
        # Its next attempt is up to MAX_RETRY away: the stop does not wait for it.
        assert embedded.stop(timeout=STOP_JOIN_MARGIN)
    assert not embedded.running
