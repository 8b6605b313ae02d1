"""``manage.py tasks_health`` on a broken deploy: each way nothing can run fails the probe with
its documented status and the reason on one line; and the probe always answers in time."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, connections
from django.db.migrations.recorder import MigrationRecorder

from django_sqltasks.models import TaskRecord, WorkerRecord
from django_sqltasks.ops.probe_report import Exit
from tests.conftest import WorkerProcess, expire_lease
from tests.events import EventLog
from tests.management.test_tasks_health import health, worker
from tests.management.test_tasks_worker import manage

pytestmark = pytest.mark.django_db


def problems(*args: str) -> tuple[int, list[dict[str, Any]]]:
    """The exit status and the problems of ``tasks_health --json``."""
    code, out = health("--json", *args)
    return code, json.loads(out)["problems"]


@pytest.mark.parametrize(
    ("tasks", "code", "says"),
    [
        # No TASKS setting: Django's default, an ImmediateBackend.
        (
            {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}},
            "no_backend",
            "No TASKS backend is a django_sqltasks backend",
        ),
        (
            {"default": {"BACKEND": "django_sqltasks.backend.SQLTaskBakend"}},
            "backend_unloadable",
            "TASKS['default']['BACKEND'] is 'django_sqltasks.backend.SQLTaskBakend', which "
            "cannot be loaded",
        ),
        (
            {
                "default": {
                    "BACKEND": "django_sqltasks.backend.SQLTaskBackend",
                    "OPTIONS": {"LEASE_TIMEOUT": -1},
                }
            },
            "backend_unusable",
            "LEASE_TIMEOUT",
        ),
    ],
    ids=["no-tasks", "backend-typo", "bad-options"],
)
def test_a_deploy_that_runs_nothing_exits_1(
    settings: Any, tasks: dict[str, Any], code: str, says: str
) -> None:
    worker(["*"])  # a worker row left by an earlier deploy changes nothing
    try:
        import django.tasks  # noqa: F401
    except ImportError:
        for entry in tasks.values():
            entry["BACKEND"] = entry["BACKEND"].replace("django.tasks", "django_tasks")
    settings.TASKS = tasks
    status, found = problems()
    assert status == Exit.MISCONFIGURED == 1
    assert [p["code"] for p in found] == [code]
    assert says in found[0]["message"] and "\n" not in found[0]["message"]
    status, out = health()
    assert status == 1 and out.splitlines()[-1].startswith("MISCONFIGURED: ")


@pytest.mark.worker_process
def test_without_the_app_installed_django_knows_no_probe() -> None:
    done = manage("tasks_health", env={"SQLTASKS_TEST_WITHOUT_APP": "1"})
    assert done.returncode == 1
    assert "Unknown command: 'tasks_health'" in done.stderr


def test_tables_not_migrated_exit_1() -> None:
    worker(["*"])
    MigrationRecorder.Migration.objects.filter(app="django_sqltasks").delete()
    status, found = problems()
    assert status == Exit.MISCONFIGURED
    assert found[0]["code"] == "not_migrated"
    assert "not applied: 0001_initial" in found[0]["message"]


@pytest.mark.parametrize("args", [["-Q", "nope"], ["--backend", "nope"]])
def test_an_unknown_queue_or_backend_is_a_bad_argument(args: list[str]) -> None:
    status, _ = health(*args)
    assert status == 2


@contextmanager
def read_only_session() -> Iterator[None]:
    """This connection's next transactions take no writes, as on a standby."""
    on, off = {
        "postgresql": (
            "SET SESSION default_transaction_read_only = on",
            "SET SESSION default_transaction_read_only = off",
        ),
        "mysql": ("SET SESSION TRANSACTION READ ONLY", "SET SESSION TRANSACTION READ WRITE"),
        "sqlite": ("PRAGMA query_only = ON", "PRAGMA query_only = OFF"),
    }[connection.vendor]
    with connection.cursor() as cursor:
        cursor.execute(on)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(off)


@pytest.mark.django_db(transaction=True)  # the probe's own transaction is read-only
def test_a_read_only_database_exits_3() -> None:
    worker(["*"])
    assert health()[0] == 0
    with read_only_session():
        status, found = problems()
    assert status == Exit.DATABASE_UNREACHABLE == 3
    assert found[0]["code"] == "database_read_only"
    assert "takes no writes" in found[0]["message"]
    assert health()[0] == 0


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="libpq's PGOPTIONS")
@pytest.mark.worker_process
@pytest.mark.django_db(transaction=True)  # the subprocess reads the committed worker row
def test_a_read_only_postgresql_session_is_one_line() -> None:
    worker(["*"])
    done = manage("tasks_health", env={"PGOPTIONS": "-c default_transaction_read_only=on"})
    assert done.returncode == 3, done.stdout + done.stderr
    assert "DATABASE_UNREACHABLE: Database 'default' takes no writes" in done.stdout
    assert "Traceback" not in done.stderr


@contextmanager
def table_locked() -> Iterator[None]:
    """Another connection holds the strongest lock on the task table (a migration's)."""
    other = connections.create_connection("default")
    table = TaskRecord._meta.db_table
    try:
        with other.cursor() as cursor:
            if other.vendor == "postgresql":
                cursor.execute("BEGIN")
                cursor.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            elif other.vendor == "mysql":
                cursor.execute(f"LOCK TABLES {table} WRITE")
            else:
                cursor.execute("BEGIN EXCLUSIVE")  # SQLite: the database's write lock
        yield
    finally:
        with other.cursor() as cursor:
            cursor.execute("UNLOCK TABLES" if other.vendor == "mysql" else "ROLLBACK")
        other.close()


@pytest.mark.django_db(transaction=True)  # the lock is another connection's
def test_a_locked_table_answers_within_the_timeout() -> None:
    worker(["*"])
    with table_locked():
        started = time.monotonic()
        status, found = problems("--timeout", "1")
        took = time.monotonic() - started
    assert status == Exit.DATABASE_UNREACHABLE
    assert [p["code"] for p in found] == ["database_timeout"]
    assert "did not answer within 1s (--timeout)" in found[0]["message"]
    # MariaDB counts lock waits in whole seconds; the rest is the probe's own statements.
    assert took < 3, took
    assert health()[0] == 0


@pytest.mark.worker_process
@pytest.mark.django_db(transaction=True)  # the worker process reads and writes the rows
def test_a_wedged_worker_fails_the_probe(worker_process: Any, events: EventLog) -> None:
    started: WorkerProcess = worker_process("--queue", "*")
    [registered] = events.wait("registered")
    worker_id = registered["worker_id"]
    assert health()[0] == 0
    os.kill(started.proc.pid, signal.SIGSTOP)  # alive, but silent
    try:
        # Its heartbeats stop: date the last one a lease back instead of waiting a lease.
        expire_lease(worker_id)
        status, out = health()
        assert status == Exit.NO_LIVE_WORKER == 4
        [line] = [line for line in out.splitlines() if line.startswith("NO_LIVE_WORKER")]
        assert f"The last, worker {worker_id!r}" in line and "is wedged" in line
    finally:
        os.kill(started.proc.pid, signal.SIGCONT)
    # Woken, it heartbeats again (the rescue may have removed its row: it registers anew).
    events.until(
        lambda: (
            WorkerRecord.objects.filter(id=worker_id, heartbeat_at__isnull=False).exists()
            and health()[0] == 0
        ),
        "the woken worker to be live again",
    )
    started.signal(signal.SIGTERM)
    assert started.wait(timeout=30) == 0, started.output
