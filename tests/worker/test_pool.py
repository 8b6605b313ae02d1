"""A worker under Django's connection pool (DATABASES[...]["OPTIONS"]["pool"], psycopg_pool):
its task threads take their connections from the pool, so a worker at a high --concurrency
running ORM tasks holds what the pool allows, not a connection a thread."""

from __future__ import annotations

import importlib.util
import json
import signal
from collections.abc import Callable

import pytest
from django.db import connection

from tests import tasks
from tests.conftest import WORKER_APPLICATION_NAME, WorkerProcess
from tests.events import EventLog, Gate

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="Django's pool is PostgreSQL's"),
    pytest.mark.skipif(
        importlib.util.find_spec("psycopg_pool") is None,
        reason="psycopg_pool is not installed (pip install 'psycopg[pool]')",
    ),
    pytest.mark.django_db(transaction=True),
]

StartWorker = Callable[..., WorkerProcess]
POOL_SIZE = 4  # the pool's max_size
RUNNING = 12  # ORM tasks running at once, each wanting a connection
OWN_OUTSIDE_POOL = 1  # the worker's LISTEN and claim connection (psycopg's own, not Django's)


def worker_sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            [WORKER_APPLICATION_NAME],
        )
        return int(cursor.fetchone()[0])


@pytest.mark.worker_process
def test_a_worker_running_many_orm_tasks_holds_what_its_pool_allows(
    worker_process: StartWorker, events: EventLog, gate: Gate
) -> None:
    pool = {"min_size": 1, "max_size": POOL_SIZE, "timeout": 120}
    worker = worker_process(
        "--concurrency", str(RUNNING * 2), env={"SQLTASKS_TEST_POOL": json.dumps(pool)}
    )
    events.wait("worker_started")
    results = [tasks.query_then_wait_at.enqueue(gate.path) for _ in range(RUNNING)]
    # Every task runs on a thread of its own, and at least one holds a connection at the gate;
    # the others wait for one from the pool.
    events.wait("note", what="started", count=RUNNING)
    events.wait("note", what="queried")
    held = worker_sessions()
    assert held <= POOL_SIZE + OWN_OUTSIDE_POOL, worker.output
    gate.open()
    for result in results:
        events.wait("task_finished", id=result.id, status="SUCCESSFUL")
    assert worker_sessions() <= POOL_SIZE + OWN_OUTSIDE_POOL
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    assert "Traceback" not in worker.output, worker.output
