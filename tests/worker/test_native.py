"""PostgreSQL's claim and LISTEN on the worker's event loop (worker/native.py): the same rows
as the database thread's claim, a wake-up on the loop, and a lost connection that costs a
fallback to the database thread, never a task."""

from __future__ import annotations

import asyncio
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus, task_finished
from django_sqltasks.models import TaskRecord
from django_sqltasks.sql import UNLIMITED, NewTask, dialect_for
from django_sqltasks.worker import Worker, native
from django_sqltasks.worker import producer as producer_module
from django_sqltasks.worker.native import LoopDatabase
from tests import tasks
from tests.conftest import (
    WORKER_APPLICATION_NAME,
    Clock,
    WorkerProcess,
    set_backend_options,
    worker_thread,
)
from tests.events import EventLog

pytestmark = [
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the event-loop claim is PostgreSQL's"
    ),
    pytest.mark.django_db(transaction=True),
]

WORKER = "loop-worker"
StartWorker = Callable[..., WorkerProcess]


def _insert(count: int, run_after: Any = None) -> list[uuid.UUID]:
    now = timezone.now()
    rows = [
        NewTask(
            id=uuid.uuid4(),
            task_path="tests.tasks.add",
            backend_name="default",
            queue_name="default",
            priority=0,
            args=[1, 2],
            kwargs={},
            enqueued_at=now,
            run_after=run_after,
        )
        for _ in range(count)
    ]
    with connection.cursor() as cursor:
        dialect_for(connection).insert(cursor, rows, notify=True)
    return [row.id for row in rows]


def _loop_database(**kwargs: Any) -> LoopDatabase:
    values: dict[str, Any] = {
        "database": "default",
        "backend_name": "default",
        "queue_names": ["default"],
        "worker_id": WORKER,
        "scope": UNLIMITED,
        "listen": False,
        "on_wake": lambda queue: None,
    }
    values.update(kwargs)
    return LoopDatabase(**values)


def _insert_and_close(count: int) -> None:
    """``_insert`` on a thread of its own, closing that thread's connection."""
    try:
        _insert(count)
    finally:
        connection.close()


def _terminate(pid: int) -> None:
    """End a session from another connection, as a failover or a DBA would."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()


def test_the_loop_claims_what_the_thread_would_with_times_read_as_django_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # libpq takes the session's time zone from PGTZ: had the connection kept it, the claim's
    # times (text in the session's zone) would be read off by five and a half hours.
    monkeypatch.setenv("PGTZ", "Asia/Kolkata")
    deferred = timezone.now() - timedelta(seconds=30)
    ids = _insert(3, run_after=deferred) + _insert(2)

    async def claim() -> tuple[list[Any], str]:
        loop_database = _loop_database()
        await loop_database.start()
        try:
            rows = await loop_database.claim(10)
            cursor = await loop_database._connection.execute("SHOW TimeZone")
            return rows, (await cursor.fetchone())[0]
        finally:
            await loop_database.close()

    rows, zone = asyncio.run(claim())
    assert zone == connection.timezone_name  # as Django sets its own connections
    assert sorted(row.id for row in rows) == sorted(ids)
    stored = {record.id: record for record in TaskRecord.objects.filter(id__in=ids)}
    for row in rows:
        record = stored[row.id]
        assert (row.enqueued_at, row.run_after) == (record.enqueued_at, record.run_after)
        assert row.worker_ids == [WORKER] and row.attempts == 1
        assert (record.status, record.owner) == ("RUNNING", WORKER)
    assert sum(row.run_after == deferred for row in rows) == 3


def test_a_lost_claim_connection_raises_then_comes_back_after_a_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()  # moved past the delay below, instead of waiting it out
    monkeypatch.setattr(native, "time", clock)
    _insert(2)

    async def scenario() -> tuple[int, bool, bool, bool, int]:
        loop_database = _loop_database()
        await loop_database.start()
        try:
            first = await loop_database.claim(1)
            await asyncio.to_thread(_terminate, loop_database._connection.info.backend_pid)
            with pytest.raises(Exception, match="terminat"):
                await loop_database.claim(1)
            down = loop_database.ready
            clock.ahead = native.RECONNECT_DELAY * 0.9
            still_down = loop_database.ready
            clock.ahead = native.RECONNECT_DELAY
            back = loop_database.ready
            second = await loop_database.claim(1)
            return len(first), down, still_down, back, len(second)
        finally:
            await loop_database.close()

    assert asyncio.run(scenario()) == (1, False, False, True, 1)


def test_a_notify_wakes_the_loop_listener() -> None:
    woken: list[str | None] = []

    async def scenario() -> None:
        by_default = asyncio.Event()

        def on_wake(queue: str | None) -> None:  # on the loop's thread, as its reader is
            woken.append(queue)
            if queue == "default":
                by_default.set()

        loop_database = _loop_database(listen=True, on_wake=on_wake)
        await loop_database.start()  # listens before it returns, then wakes with None
        try:
            assert woken == [None]
            await asyncio.to_thread(_insert_and_close, 1)
            try:
                await asyncio.wait_for(by_default.wait(), 30)  # a bound only
            except TimeoutError:
                pytest.fail(f"no wake-up for queue 'default' within 30 s; woken: {woken}")
        finally:
            await loop_database.close()

    asyncio.run(scenario())
    assert woken[0] is None and "default" in woken


@pytest.mark.worker_process
def test_a_killed_claim_connection_falls_back_and_runs_each_task_once(
    worker_process: StartWorker, events: EventLog, tmp_path: Path
) -> None:
    log = tmp_path / "executions"
    worker = worker_process("--concurrency", "4", env={"SQLTASKS_POLL_INTERVAL": "0.2"})
    events.wait("worker_started")
    count = 0
    for _ in range(3):
        for _ in range(40):
            tasks.record.enqueue(str(log), f"task-{count}", 0.005)
            count += 1
        events.wait("task_finished", count=count - 30)  # the worker is into this batch
        with connection.cursor() as cursor:  # only the loop's claim connection
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = %s "
                "AND query LIKE %s AND pid <> pg_backend_pid()",
                [WORKER_APPLICATION_NAME, "%priorities(p) AS%"],
            )
    events.wait("task_finished", count=count, timeout=60)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    executions = Counter(line.split()[0] for line in log.read_text().splitlines())
    assert len(executions) == count and max(executions.values()) == 1
    # Seen by the loop's watch of the socket, or by the claim that met the dead connection.
    assert (
        "Listening for new tasks failed" in worker.output
        or "Claim on the event loop failed" in worker.output
    )
    assert TaskRecord.objects.exclude(status=TaskResultStatus.SUCCESSFUL).count() == 0


def test_the_aenqueue_pool_runs_djangos_session_setup_too(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_sqltasks.enqueue.coalescer import PostgresWriter

    monkeypatch.setenv("PGTZ", "Asia/Kolkata")  # libpq's default for the session's time zone

    async def zone() -> str:
        writer = await PostgresWriter.open("default")
        try:
            async with writer.pool.connection() as pooled:
                cursor = await pooled.execute("SHOW TimeZone")
                return str((await cursor.fetchone())[0])
        finally:
            await writer.aclose()

    assert asyncio.run(zone()) == connection.timezone_name


@pytest.mark.parametrize(("listen", "direct"), [(True, False), (False, False), (False, True)])
def test_the_listening_connection_claims_with_a_prepared_statement(
    listen: bool, direct: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection that holds LISTEN is a direct session: its claim is prepared there even
    with Django's default OPTIONS (no prepared statements, for poolers' sake); a claim on a
    connection that does not listen is not, unless the project prepares statements
    (OPTIONS prepare_threshold), and only a session of its own (``direct``: the backend's
    DATABASE takes the LISTEN) gets the worker's settings."""
    first, second = _insert(2), _insert(2)

    async def claim_twice() -> tuple[list[Any], list[Any], int, str]:
        loop_database = _loop_database(listen=listen, direct=direct)
        if direct:  # where the project prepares statements on its direct connections
            params = native.connection_params("default")
            monkeypatch.setattr(
                native, "connection_params", lambda alias: {**params, "prepare_threshold": 0}
            )
        await loop_database.start()
        try:
            rows = await loop_database.claim(2)
            more = await loop_database.claim(2)
            cursor = await loop_database._connection.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                ["%json_agg%"],
            )
            prepared = (await cursor.fetchone())[0]
            cursor = await loop_database._connection.execute(
                "SELECT current_setting('enable_seqscan') || ' ' || current_setting('jit')"
            )
            return rows, more, prepared, (await cursor.fetchone())[0]
        finally:
            await loop_database.close()

    rows, more, prepared, seqscan = asyncio.run(claim_twice())
    assert prepared == (1 if listen or direct else 0)
    # A claim planned once on a session of its own keeps to the indexes (sql/prepared.py);
    # one planned at each call, or on a session a pooler may share, is left as it is.
    # (JIT off with it; elsewhere as the server has it.)
    assert seqscan == "off off" if listen or direct else seqscan.startswith("on ")
    assert sorted(row.id for row in rows + more) == sorted(first + second)
    assert all(row.worker_ids == [WORKER] and row.corrupt is None for row in rows + more)


def _run_until_finished(worker: Any, count: int, start: Callable[[], list[str]]) -> list[str]:
    """Run ``worker`` on a thread, call ``start`` (which enqueues), and wait until ``count``
    tasks of the ids it returns have finished (task_finished)."""
    finished: list[str] = []
    done = threading.Event()
    ids: list[str] = []

    def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        if task_result.id in ids and task_result.status == TaskResultStatus.SUCCESSFUL:
            finished.append(task_result.id)
            if len(finished) >= count:
                done.set()

    task_finished.connect(on_finished)
    try:
        with worker_thread(worker):
            ids.extend(start())
            assert done.wait(30), "the task did not run before the poll, an hour away"
    finally:
        task_finished.disconnect(on_finished)
    return finished


def test_a_listening_worker_that_drained_the_queue_sleeps_until_told(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """After a claim that found tasks but drained the queue, a listening worker sleeps until
    a notification (or its poll): the claims it made 10, 30, 70, 150 ms later, each after the
    last, found nothing, since every new task announces itself."""
    set_backend_options(settings, HEARTBEAT_INTERVAL=3600, LEASE_TIMEOUT=7200)
    slept: list[float] = []
    after_claim = threading.Event()
    held: list[bool] = []
    hold, sleep = producer_module.Producer._hold, producer_module.Producer.sleep

    def hold_and_note(self: Any, rows: list[Any], **kwargs: Any) -> None:
        if rows:
            held.append(True)
        hold(self, rows, **kwargs)

    async def sleep_and_note(self: Any, seconds: float, **kwargs: Any) -> None:
        if held and not after_claim.is_set():
            slept.append(seconds)
            after_claim.set()
        await sleep(self, seconds, **kwargs)

    monkeypatch.setattr(producer_module.Producer, "_hold", hold_and_note)
    monkeypatch.setattr(producer_module.Producer, "sleep", sleep_and_note)
    worker = Worker(concurrency=2, queue_names=["*"], poll_interval=3600)
    _run_until_finished(worker, 1, lambda: [tasks.add.enqueue(1, 2).id])
    assert after_claim.is_set()
    assert slept == [3600]


def test_a_retry_due_now_runs_at_once_with_the_poll_an_hour_away(
    settings: Any, tmp_path: Path
) -> None:
    """A retry without backoff is claimed again as soon as its outcome is stored: the worker
    tells itself, as no notification announces a retry."""
    set_backend_options(settings, HEARTBEAT_INTERVAL=3600, LEASE_TIMEOUT=7200)
    worker = Worker(concurrency=2, queue_names=["*"], poll_interval=3600)
    counter = tmp_path / "calls"
    _run_until_finished(worker, 1, lambda: [tasks.flaky.enqueue(str(counter), 1).id])
    assert counter.read_text().splitlines() == ["call", "call"]


def test_a_retry_due_soon_runs_when_due_with_the_poll_an_hour_away(
    settings: Any, tmp_path: Path
) -> None:
    """A retry due in 0.4 s wakes its worker then (an hour-long poll would miss it)."""
    set_backend_options(settings, HEARTBEAT_INTERVAL=3600, LEASE_TIMEOUT=7200)
    worker = Worker(concurrency=2, queue_names=["*"], poll_interval=3600)
    counter = tmp_path / "calls"
    _run_until_finished(worker, 1, lambda: [tasks.flaky_with_backoff.enqueue(str(counter), 1).id])
    assert counter.read_text().splitlines() == ["call", "call"]
