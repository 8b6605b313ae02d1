"""A worker behind PgBouncer in transaction mode: every query through the pooler but its LISTEN
(and the claim on that connection), which OPTIONS["LISTEN_DATABASE"] sends straight to the
server, so an enqueue made through the pooler still wakes it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
from django.db import connection

from tests import tasks
from tests.conftest import WorkerProcess
from tests.events import EventLog
from tests.pgbouncer import PgBouncer, find_pgbouncer

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PgBouncer is PostgreSQL's"),
    pytest.mark.django_db(transaction=True),
]

StartWorker = Callable[..., WorkerProcess]


@pytest.fixture
def pgbouncer() -> Iterator[PgBouncer]:
    binary = find_pgbouncer()
    if binary is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer): no pooler to test")
    bouncer = PgBouncer(binary, connection.settings_dict).start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


@contextlib.contextmanager
def through(bouncer: PgBouncer) -> Iterator[None]:
    """This thread's queries (an enqueue: its INSERT and the NOTIFY riding in it) go through
    ``bouncer`` for the ``with`` block."""
    settings_dict = connection.settings_dict
    saved = settings_dict["HOST"], settings_dict["PORT"]
    connection.close()
    settings_dict["HOST"], settings_dict["PORT"] = "127.0.0.1", bouncer.port
    try:
        yield
    finally:
        connection.close()
        settings_dict["HOST"], settings_dict["PORT"] = saved


@pytest.mark.worker_process
def test_an_enqueue_through_pgbouncer_wakes_a_worker_whose_listen_goes_direct(
    worker_process: StartWorker, events: EventLog, pgbouncer: PgBouncer
) -> None:
    worker = worker_process(
        "--concurrency",
        "2",
        env={
            "SQLTASKS_TEST_POOLER_PORT": str(pgbouncer.port),
            "SQLTASKS_TEST_LISTEN_DATABASE": "direct",
            # Polls an hour apart: a task that starts was woken by its NOTIFY.
            "SQLTASKS_POLL_INTERVAL": "3600",
        },
    )
    events.wait("worker_started")
    assert events.all("listening"), worker.output
    # The worker's other sessions (its registration) went through PgBouncer.
    assert "login attempt" in pgbouncer.output, pgbouncer.output
    for round_ in range(3):
        with through(pgbouncer):
            result = tasks.add.enqueue(round_, 1)
        events.wait("task_finished", id=result.id, status="SUCCESSFUL", timeout=30)
    assert "Listening for new tasks failed" not in worker.output
