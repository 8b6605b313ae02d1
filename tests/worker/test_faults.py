"""The gauntlet, database faults: restarts, killed connections, old snapshots, held locks,
deadlocks and a database that is not there. Workers ride them out; nothing is lost."""

from __future__ import annotations

import json
import logging
import signal
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.db.backends.signals import connection_created

from django_sqltasks.models import StepRecord, TaskRecord
from django_sqltasks.sql.retries import run_with_retries
from django_sqltasks.sql.rows import PARKED
from django_sqltasks.worker import Worker
from django_sqltasks.worker.completer import JUDGE_AFTER
from tests import gauntlet_tasks, tasks_durable
from tests.conftest import WORKER_APPLICATION_NAME, WorkerProcess, run_python
from tests.events import EventLog, Gate
from tests.gauntlet_mariadb import PrivateMariaDB, find_mariadbd
from tests.gauntlet_postgres import PrivatePostgres, find_bindir
from tests.lost_connections import SHORT_LOCK_TIMEOUT, STATEMENTS, Retried

pytestmark = [pytest.mark.django_db(transaction=True)]

StartWorker = Callable[..., WorkerProcess]
STAGES = list(STATEMENTS)  # the durable stages a restart meets
RunWorker = Callable[..., Worker]
TABLE = TaskRecord._meta.db_table
postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="runs in the PostgreSQL leg of the suite"
)


def enqueue_marks(log: Path, count: int, seconds: float = 0.0) -> None:
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((str(log), f"t{i}", seconds), {}) for i in range(count)
    ]
    gauntlet_tasks.mark_slowly.get_backend().enqueue_many(gauntlet_tasks.mark_slowly, calls)


# A PostgreSQL restart ------------------------------------------------------------------------


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    server = PrivatePostgres(bindir).init()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def private_server() -> Iterator[PrivatePostgres | PrivateMariaDB]:
    """A private server of the suite's database to restart: PostgreSQL or MariaDB."""
    server: PrivatePostgres | PrivateMariaDB
    if connection.vendor == "postgresql":
        bindir = find_bindir()
        if bindir is None:
            pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
        server = PrivatePostgres(bindir)
    elif connection.vendor == "mysql":
        binaries = find_mariadbd()
        if binaries is None:
            pytest.skip("no MariaDB server binaries (mariadbd, mariadb-install-db) here")
        server = PrivateMariaDB(binaries)
    else:
        pytest.skip("an SQLite database has no server to restart")
    try:
        yield server.init()
    finally:
        server.stop()


MIGRATE = "from django.core.management import call_command\ncall_command('migrate', verbosity=0)\n"


def private_env(server: PrivatePostgres | PrivateMariaDB) -> dict[str, str]:
    """A worker's environment on ``server``: a short lease and heartbeat, to see a restart."""
    return {
        "DATABASE_URL": server.url,
        "SQLTASKS_TEST_DB_NAME": server.database,
        "SQLTASKS_LEASE_TIMEOUT": "10",
        "SQLTASKS_HEARTBEAT_INTERVAL": "1",
    }


@postgres_only
@pytest.mark.worker_process
def test_workers_ride_out_a_postgres_restart(
    private_postgres: PrivatePostgres,
    worker_process: StartWorker,
    events: EventLog,
    tmp_path: Path,
) -> None:
    import psycopg

    env = private_env(private_postgres)
    log = tmp_path / "executions"
    count = 2000
    setup = run_python(
        MIGRATE + "from tests import gauntlet_tasks as g\n"
        f"calls = [(({str(log)!r}, f't{{i}}', 0.02), {{}}) for i in range({count})]\n"
        "g.mark_slowly.get_backend().enqueue_many(g.mark_slowly, calls)\n",
        **env,
    )
    assert setup.returncode == 0, setup.stderr
    workers = [
        worker_process("--concurrency", "8", "--worker-id", f"w{n}", env=env) for n in range(2)
    ]
    events.wait("task_finished", count=count // 4, timeout=60)
    private_postgres.restart()
    restarted = time.monotonic()
    events.wait("task_finished", count=count, timeout=120)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=60) == 0, worker.output
    with psycopg.connect(private_postgres.url) as c:
        statuses: dict[str, int] = dict(
            c.execute(f"SELECT status, count(*) FROM {TABLE} GROUP BY 1").fetchall()
        )
        retried = c.execute(f"SELECT count(*) FROM {TABLE} WHERE attempts > 1").fetchone()[0]
    assert statuses == {"SUCCESSFUL": count}
    executions = Counter(gauntlet_tasks.executions(log))
    assert set(executions) == {f"t{i}" for i in range(count)}, "a task was lost"
    assert [k for k, v in executions.items() if v > 1] == [], "a task ran twice"
    output = "".join(w.output for w in workers)
    assert "Transient database error" in output
    print(f"\nrestart: all done {time.monotonic() - restarted:.1f}s later; {retried} claimed again")


@postgres_only
@pytest.mark.worker_process
def test_durable_tasks_ride_out_a_postgres_restart(
    private_postgres: PrivatePostgres,
    worker_process: StartWorker,
    events: EventLog,
    tmp_path: Path,
) -> None:
    """Durable tasks parked at a wait when the server restarts; half their events sent just
    before it (so tasks resume across it), half after. Every task ends once with its own
    payload, no event is lost, and a step whose record committed never runs again."""
    import psycopg

    env = private_env(private_postgres)
    log = tmp_path / "steps"
    count = 40
    setup = run_python(
        MIGRATE + "from tests import tasks_durable as d\n"
        f"for i in range({count}): d.waiter.enqueue({str(log)!r}, 'paid', str(i))\n",
        **env,
    )
    assert setup.returncode == 0, setup.stderr

    def send(keys: range) -> None:
        sent = run_python(
            "from django_sqltasks import send_event\n"
            f"assert all([send_event('paid', str(i), {{'key': i}}) for i in {keys!r}])\n",
            **env,
        )
        assert sent.returncode == 0, sent.stderr

    worker = worker_process("--concurrency", "8", "--worker-id", "w", env=env)
    with psycopg.connect(private_postgres.url, autocommit=True) as c:

        def parked() -> bool:
            sql = f"SELECT count(*) FROM {TABLE} WHERE status = 'READY' AND available_at >= %s"
            return c.execute(sql, [PARKED]).fetchone()[0] == count

        events.until(parked, f"{count} tasks parked at their wait")
    send(range(count // 2))
    private_postgres.restart()
    send(range(count // 2, count))
    events.wait("task_finished", count=count, timeout=120)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, worker.output
    with psycopg.connect(private_postgres.url) as c:
        rows = c.execute(f"SELECT status, return_value FROM {TABLE}").fetchall()
        steps = c.execute(
            f"SELECT name, count(*) FROM {StepRecord._meta.db_table} "
            "WHERE state = 'done' GROUP BY 1"
        ).fetchall()
    assert sorted(rows, key=lambda r: r[1]["key"]) == [
        ("SUCCESSFUL", {"key": i}) for i in range(count)
    ]
    assert dict(steps)["before"] == count
    done = Counter(tasks_durable.effects(log))
    assert done["before"] == count, "a recorded step ran again"
    # An "after" step the restart cut short before its record committed may run again.
    assert {f"after:{i}" for i in range(count)} == {k for k in done if k.startswith("after")}
    assert len(events.all("task_finished")) == count  # each task ended once


@pytest.mark.worker_process
def test_a_restart_at_each_durable_stage_costs_time_not_the_task(
    private_server: PrivatePostgres | PrivateMariaDB,
    worker_process: StartWorker,
    events: EventLog,
    gate: Gate,
    tmp_path: Path,
) -> None:
    """A task held at each durable stage's statement (a step's record, a park, an event
    read, a group add) while the server restarts under it, on PostgreSQL and MariaDB. With
    max_attempts=1, each task's thread reconnects and goes on: every task SUCCESSFUL, every
    step's effect once."""
    env = private_env(private_server)
    log = tmp_path / "steps"
    setup = run_python(
        MIGRATE + "from tests import tasks_durable as d\n"
        f"for stage in {STAGES!r}: d.enqueue_losing({str(log)!r}, stage, 'paused', "
        f"{gate.path!r})\n",
        **env,
    )
    assert setup.returncode == 0, setup.stderr
    worker = worker_process("--concurrency", "8", "--worker-id", "w", env=env)
    events.wait("note", count=len(STAGES), timeout=120, what="paused")
    private_server.restart()
    gate.open()
    count = len(STAGES) + 3  # the group's other member, the one added, and its callback
    events.wait("task_finished", count=count, timeout=120)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, worker.output
    statuses = dict(private_server.query(f"SELECT status, count(*) FROM {TABLE} GROUP BY 1"))
    summed = private_server.query(
        f"SELECT return_value FROM {TABLE} WHERE task_path LIKE '%sum_of'"
    )
    twice = private_server.query(
        f"SELECT name, attempts FROM {StepRecord._meta.db_table} WHERE attempts > 1"
    )
    assert statuses == {"SUCCESSFUL": count}, worker.output
    assert [json.loads(v) if isinstance(v, str) else v for (v,) in summed] == [1 + 10 + 2]
    assert twice == []
    effects = Counter(tasks_durable.effects(log))
    assert effects == {f"{n}:{s}": 1 for s in STAGES for n in ("one", "two")}
    assert worker.output.count("Transient database error in task id=") >= len(STAGES)


@postgres_only
@pytest.mark.worker_process
def test_killed_listen_connection_comes_back(worker_process: StartWorker, events: EventLog) -> None:
    """pg-boss's test: kill every worker connection, LISTEN included; enqueues still wake it."""
    worker = worker_process("--concurrency", "2", env={"SQLTASKS_POLL_INTERVAL": "30"})
    events.wait("worker_started")
    listening = events.wait("listening")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            [WORKER_APPLICATION_NAME],
        )
    # The listener reconnects after its delay; the worker polls every 30 s.
    events.wait("listening", after=listening[0].seq + 1, timeout=15)
    started = time.monotonic()
    result = gauntlet_tasks.size.enqueue("abc")
    events.wait("task_finished", id=str(result.id), timeout=15)
    latency = time.monotonic() - started
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    assert latency < 5, f"woken by polling, not by NOTIFY: {latency:.1f}s"
    # Seen by the loop's watch of the socket or, when the kill came during a claim, by that
    # claim; either way the listener came back (the second listening event above).
    assert (
        "Listening for new tasks failed" in worker.output
        or "Claim on the event loop failed" in worker.output
    )


# An old snapshot -----------------------------------------------------------------------------


SNAPSHOT_SQL = {
    "postgresql": ["BEGIN ISOLATION LEVEL REPEATABLE READ"],
    # Django opens MySQL connections in READ COMMITTED: ask for a real snapshot.
    "mysql": [
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        "START TRANSACTION WITH CONSISTENT SNAPSHOT",
    ],
    "sqlite": ["BEGIN"],
}


def test_an_old_snapshot_does_not_stall_the_queue(run_worker: RunWorker, tmp_path: Path) -> None:
    log = tmp_path / "executions"
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            for sql in SNAPSHOT_SQL[connection.vendor]:
                cursor.execute(sql)
            cursor.execute(f"SELECT count(*) FROM {TABLE}")
            assert cursor.fetchone()[0] == 0
            count = 500
            enqueue_marks(log, count)
            started = time.monotonic()
            run_worker(concurrency=8)
            elapsed = time.monotonic() - started
            cursor.execute(f"SELECT count(*) FROM {TABLE}")
            assert cursor.fetchone()[0] == 0, "the snapshot was not held during the run"
    finally:
        other.close()
    assert TaskRecord.objects.succeeded().count() == count
    assert Counter(gauntlet_tasks.executions(log)).most_common(1)[0][1] == 1
    assert elapsed < 60


# A lock held longer than the lock timeout -----------------------------------------------------


def short_lock_timeouts(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Give the worker's connections a short lock timeout, so a held lock raises."""
    if threading.current_thread().name.startswith("sqltasks"):
        with connection.cursor() as cursor:
            cursor.execute(SHORT_LOCK_TIMEOUT[connection.vendor])


def hold_table_lock(until: threading.Event) -> None:
    """Lock the task table against every write (and on MySQL and PostgreSQL, every read) until
    ``until`` is set (at most 30 seconds)."""
    if connection.vendor == "sqlite":
        raw = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        try:
            raw.execute("BEGIN IMMEDIATE")
            until.wait(30)
            raw.execute("COMMIT")
        finally:
            raw.close()
        return
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            if connection.vendor == "mysql":
                cursor.execute(f"LOCK TABLES {TABLE} WRITE")
                until.wait(30)
                cursor.execute("UNLOCK TABLES")
            else:
                cursor.execute("BEGIN")
                cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
                until.wait(30)
                cursor.execute("COMMIT")
    finally:
        other.close()


def test_a_lock_held_past_the_lock_timeout_is_retried(
    run_worker: RunWorker, events: EventLog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """MariaDB lock wait timeouts, PostgreSQL lock_timeout, SQLite "database is locked"."""
    log = tmp_path / "executions"
    count = 600
    enqueue_marks(log, count, 0.002)

    retried = Retried()

    def lock_once_under_way() -> None:
        events.wait("task_finished", count=50, timeout=60)
        hold_table_lock(until=retried.event)  # until the lock got in the worker's way

    locker = threading.Thread(target=lock_once_under_way)
    connection_created.connect(short_lock_timeouts, dispatch_uid="gauntlet-lock-timeout")
    logging.getLogger("django_sqltasks").addHandler(retried)
    try:
        locker.start()
        # INFO: a lock conflict's retry is logged at INFO (it was rolled back, nothing lost).
        with caplog.at_level(logging.INFO, logger="django_sqltasks"):
            run_worker(concurrency=4)
        locker.join()
    finally:
        logging.getLogger("django_sqltasks").removeHandler(retried)
        connection_created.disconnect(dispatch_uid="gauntlet-lock-timeout")
    retries = [r for r in caplog.records if getattr(r, "action", None) == "db_retry"]
    assert retries, "the lock did not get in the worker's way"
    assert TaskRecord.objects.succeeded().count() == count
    executions = Counter(gauntlet_tasks.executions(log))
    assert len(executions) == count
    assert max(executions.values()) == 1
    print(f"\n{len(retries)} retries: {retries[0].getMessage()}")


class Rounds(logging.Handler):
    """Set ``enough`` once the worker has logged ``count`` rounds of outcome writes that met
    a transient error."""

    def __init__(self, count: int, enough: threading.Event) -> None:
        super().__init__()
        self.count = count
        self.enough = enough
        self.seen = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "outcome(s) met a transient error" in record.getMessage():
            self.seen += 1
            if self.seen >= self.count:
                self.enough.set()


# Refuses what a fenced primary refuses of an outcome (SQLSTATE 25006, read_only_sql_transaction)
# while the one row of FENCE says so: whichever of the worker's threads writes outcomes (the
# database thread on PostgreSQL), and nothing else of the worker's.
FENCE = "sqltasks_test_fence"
FENCE_SQL = [
    f"CREATE TABLE {FENCE} (fenced boolean NOT NULL)",
    f"INSERT INTO {FENCE} VALUES (true)",
    f"""CREATE FUNCTION {FENCE}() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF NEW.status IN ('SUCCESSFUL', 'FAILED') AND (SELECT fenced FROM {FENCE}) THEN
            RAISE EXCEPTION 'cannot execute UPDATE in a read-only transaction'
                USING ERRCODE = 'read_only_sql_transaction';
        END IF;
        RETURN NEW;
    END $$""",
    f"CREATE TRIGGER {FENCE} BEFORE UPDATE ON {TaskRecord._meta.db_table} FOR EACH ROW "
    f"EXECUTE FUNCTION {FENCE}()",
]
UNFENCE_SQL = [
    f"DROP TRIGGER IF EXISTS {FENCE} ON {TaskRecord._meta.db_table}",
    f"DROP FUNCTION IF EXISTS {FENCE}()",
    f"DROP TABLE IF EXISTS {FENCE}",
]


@postgres_only
def test_outcomes_wait_for_a_server_that_takes_no_writes(
    run_worker: RunWorker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A primary fenced for a switchover (every transaction read-only; with one host there is
    no other to go to) refuses every outcome alike: they wait, past the rounds after which an
    outcome refused while the database answers is judged the statement's fault and salvaged,
    and are stored once the server takes writes again. None is blamed on the way."""
    log = tmp_path / "executions"
    enqueue_marks(log, 3)
    enough = threading.Event()
    rounds = Rounds(JUDGE_AFTER + 2, enough)

    def lift() -> None:
        if enough.wait(120):
            with connections["default"].cursor() as cursor:
                cursor.execute(f"UPDATE {FENCE} SET fenced = false")
        connections["default"].close()

    with connection.cursor() as cursor:
        for sql in FENCE_SQL:
            cursor.execute(sql)
    lifter = threading.Thread(target=lift, daemon=True)
    lifter.start()
    logging.getLogger("django_sqltasks").addHandler(rounds)
    try:
        with caplog.at_level(logging.WARNING, logger="django_sqltasks"):
            run_worker(concurrency=2)
    finally:
        logging.getLogger("django_sqltasks").removeHandler(rounds)
        enough.set()
        lifter.join(10)
        with connection.cursor() as cursor:
            for sql in UNFENCE_SQL:
                cursor.execute(sql)
    assert rounds.seen > JUDGE_AFTER
    blamed = [
        r.getMessage() for r in caplog.records if "refused this task's outcome" in r.getMessage()
    ]
    assert blamed == []
    assert list(TaskRecord.objects.values_list("status", flat=True)) == ["SUCCESSFUL"] * 3
    assert Counter(gauntlet_tasks.executions(log)) == {f"t{i}": 1 for i in range(3)}


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has one writer: no deadlocks")
def test_a_deadlock_is_retried(caplog: pytest.LogCaptureFixture) -> None:
    first = TaskRecord.objects.create(task_path="tests.tasks.noop", backend_name="default")
    second = TaskRecord.objects.create(task_path="tests.tasks.noop", backend_name="default")
    barrier = threading.Barrier(2, timeout=10)
    done: list[str] = []
    failures: list[BaseException] = []

    def lock_in_order(name: str, ids: list[Any]) -> None:
        tries = 0

        def both() -> None:
            nonlocal tries
            tries += 1
            with transaction.atomic():
                TaskRecord.objects.filter(id=ids[0]).update(priority=1)
                if tries == 1:
                    barrier.wait()  # both hold their first row: each now waits on the other
                TaskRecord.objects.filter(id=ids[1]).update(priority=2)

        try:
            run_with_retries("default", both)
            done.append(name)
        except BaseException as e:
            failures.append(e)
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=lock_in_order, args=("a", [first.id, second.id])),
        threading.Thread(target=lock_in_order, args=("b", [second.id, first.id])),
    ]
    with caplog.at_level(logging.INFO, logger="django_sqltasks"):
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert failures == []
    assert sorted(done) == ["a", "b"]
    messages = [r.getMessage().lower() for r in caplog.records]
    assert any("deadlock" in m for m in messages), messages
    # Said as what it is: rolled back and retried, at INFO (MariaDB's "Deadlock found" in a
    # warning read as a fault).
    [retry] = [r for r in caplog.records if "deadlock" in r.getMessage().lower()]
    assert retry.levelno == logging.INFO
    assert "this try was rolled back, retrying" in retry.getMessage()


# A database that is not there ----------------------------------------------------------------


# (DATABASE_URL, database name): nothing listens on port 1, and the directory does not exist.
UNREACHABLE = {
    "postgresql": ("postgres://postgres@127.0.0.1:1/sqltasks", "sqltasks"),
    "mysql": ("mysql://root@127.0.0.1:1/sqltasks", "sqltasks"),
    "sqlite": ("sqlite:////nonexistent/db.sqlite3", "/nonexistent/db.sqlite3"),
}


def test_enqueue_to_an_unreachable_database_raises_a_clear_error() -> None:
    url, name = UNREACHABLE[connection.vendor]
    result = run_python(
        "from tests import tasks\ntasks.noop.enqueue()\n",
        DATABASE_URL=url,
        SQLTASKS_TEST_DB_NAME=name,
    )
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("django.db.utils.")]
    assert errors, result.stderr
    assert errors[-1].startswith("django.db.utils.OperationalError"), result.stderr
    print(f"\n{errors[-1]}")


def kill_own_connection() -> None:
    """Kill this thread's connection from another session, as a failover or a DBA would."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_backend_pid()")
            sql = "SELECT pg_terminate_backend(%s)"
        else:
            cursor.execute("SELECT CONNECTION_ID()")
            sql = "KILL CONNECTION %s"
        pid = cursor.fetchone()[0]
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(sql, [pid])
    finally:
        other.close()


@pytest.mark.skipif(connection.vendor == "sqlite", reason="an SQLite connection cannot be killed")
def test_enqueue_on_a_dead_connection_writes_nothing() -> None:
    def enqueue_twice_dying_between() -> None:
        with transaction.atomic():
            gauntlet_tasks.size.enqueue("first")
            kill_own_connection()
            gauntlet_tasks.size.enqueue("second")

    with pytest.raises(DatabaseError):
        enqueue_twice_dying_between()
    connection.close()
    assert not TaskRecord.objects.exists(), "half a transaction was written"
    # The next enqueue, on a new connection, works.
    gauntlet_tasks.size.enqueue("third")
    assert list(TaskRecord.objects.values_list("args", flat=True)) == [["third"]]
