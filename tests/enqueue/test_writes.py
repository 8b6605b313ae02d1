"""Enqueueing at speed: coalesced aenqueue, bulk enqueue_many, and their transaction rules."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections, transaction
from django.http import HttpRequest, JsonResponse
from django.test import Client
from django.urls import path

from django_sqltasks.compat import TASKS_LOGGER, TaskResultStatus, task_backends, task_enqueued
from django_sqltasks.enqueue import coalescer as aio
from django_sqltasks.exceptions import InvalidTaskArguments
from django_sqltasks.models import TaskRecord
from tests import tasks
from tests.conftest import set_backend_options

pytestmark = pytest.mark.django_db


async def close_thread_connections() -> None:
    await sync_to_async(connections.close_all)()


@pytest.fixture
def batch_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record how many rows each INSERT of the coalescer carried (the INSERT still runs)."""
    sizes: list[int] = []
    for writer in (aio.PostgresWriter, aio.ThreadWriter):
        original = writer.insert

        async def insert(self: Any, rows: Any, notify: bool, _original: Any = original) -> None:
            sizes.append(len(rows))
            await _original(self, rows, notify)

        monkeypatch.setattr(writer, "insert", insert)
    return sizes


@pytest.mark.django_db(transaction=True)
async def test_concurrent_aenqueues_share_inserts(batch_sizes: list[int]) -> None:
    results = await asyncio.gather(*(tasks.add.aenqueue(i, 1) for i in range(300)))
    assert len({r.id for r in results}) == 300
    assert sum(batch_sizes) == 300
    assert len(batch_sizes) < 30, batch_sizes  # far fewer statements than tasks
    writer = (await aio.coalescer_for(task_backends["default"]))._writer
    expected = aio.PostgresWriter if connection.vendor == "postgresql" else aio.ThreadWriter
    assert type(writer) is expected  # native on the loop on PostgreSQL
    assert await TaskRecord.objects.acount() == 300
    fetched = await tasks.add.aget_result(results[17].id)
    assert fetched.args == [17, 1]
    assert fetched.status == TaskResultStatus.READY
    await close_thread_connections()


@pytest.mark.django_db(transaction=True)
async def test_each_caller_gets_its_own_error() -> None:
    from datetime import date

    outcomes = await asyncio.gather(
        tasks.add.aenqueue(1, 2),
        tasks.echo.aenqueue(date.today()),
        tasks.add.aenqueue(3, 4),
        return_exceptions=True,
    )
    assert isinstance(outcomes[1], InvalidTaskArguments)
    assert "args[0] is a datetime.date" in str(outcomes[1])
    for result in (outcomes[0], outcomes[2]):
        assert (await tasks.add.aget_result(result.id)).status == TaskResultStatus.READY
    assert await TaskRecord.objects.acount() == 2
    await close_thread_connections()


@pytest.mark.django_db(transaction=True)
async def test_a_row_the_database_refuses_fails_alone() -> None:
    backend = task_backends["default"]
    coalescer = await aio.coalescer_for(backend)
    good = [backend.new_row(tasks.add, (i, i), {}) for i in range(5)]
    bad_row, bad_result = backend.new_row(tasks.add, (0, 0), {})
    bad_row.priority = 1000  # past the CHECK constraint: only the database can refuse it
    outcomes = await asyncio.gather(
        *(coalescer.submit(row, result) for row, result in good[:2]),
        coalescer.submit(bad_row, bad_result),
        *(coalescer.submit(row, result) for row, result in good[2:]),
        return_exceptions=True,
    )
    assert [isinstance(o, Exception) for o in outcomes] == [False, False, True, False, False, False]
    assert await TaskRecord.objects.acount() == 5
    assert not await TaskRecord.objects.filter(id=bad_row.id).aexists()
    await close_thread_connections()


@pytest.mark.django_db(transaction=True)
async def test_aenqueue_sends_task_enqueued_for_each_task() -> None:
    received: list[Any] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        received.append((sender, task_result.id))

    task_enqueued.connect(receiver)
    try:
        results = await asyncio.gather(*(tasks.noop.aenqueue() for _ in range(20)))
    finally:
        task_enqueued.disconnect(receiver)
    assert sorted(received) == sorted((type(task_backends["default"]), r.id) for r in results)
    await close_thread_connections()


@pytest.mark.django_db(transaction=True)
async def test_aenqueue_logs_through_djangos_receiver_when_its_logger_takes_debug(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch skips task_enqueued only while no receiver would act: Django's own receiver
    logs at DEBUG, so with that level on, each task is logged; with it off, nothing is sent
    (and no thread is hopped to for it)."""
    backend = type(task_backends["default"])
    sends: list[int] = []
    original = aio._send_enqueued

    def send(sender: type, results: list[Any]) -> list[Exception | None]:
        sends.append(len(results))
        return original(sender, results)

    monkeypatch.setattr(aio, "_send_enqueued", send)
    with caplog.at_level(logging.WARNING, logger=TASKS_LOGGER):
        assert aio.enqueued_unheard(backend)
        await asyncio.gather(*(tasks.noop.aenqueue() for _ in range(5)))
    assert sends == []
    with caplog.at_level(logging.DEBUG, logger=TASKS_LOGGER):
        assert not aio.enqueued_unheard(backend)
        results = await asyncio.gather(*(tasks.noop.aenqueue() for _ in range(5)))
    logged = {r.args[0] for r in caplog.records if r.name == TASKS_LOGGER and r.args}
    assert {r.id for r in results} <= logged and sum(sends) == 5

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        pass

    task_enqueued.connect(receiver)
    try:
        with caplog.at_level(logging.WARNING, logger=TASKS_LOGGER):
            assert not aio.enqueued_unheard(backend)
    finally:
        task_enqueued.disconnect(receiver)
    await close_thread_connections()


def hold_write_lock(
    release: threading.Event, locked: threading.Event, released: list[bool] | None = None
) -> None:
    """Block writes to the task table from another connection until ``release`` is set (or
    30 s have passed: a test that never sets it fails on what it finds then). ``released``
    gets whether ``release`` ended the hold (True) or the 30 s did (False)."""
    other = connections.create_connection("default")
    table = TaskRecord._meta.db_table
    try:
        with other.cursor() as cursor:
            if other.vendor == "sqlite":
                other.connection.isolation_level = None
                cursor.execute("BEGIN IMMEDIATE")
            elif other.vendor == "postgresql":
                other.set_autocommit(False)
                cursor.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            else:
                cursor.execute(f"LOCK TABLES {table} WRITE")
            locked.set()
            ended_by_release = release.wait(30)
            if released is not None:
                released.append(ended_by_release)
            if other.vendor == "mysql":
                cursor.execute("UNLOCK TABLES")
            else:
                cursor.execute("COMMIT") if other.vendor == "sqlite" else other.commit()
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)
async def test_enqueue_never_blocks_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fifty ``aenqueue()`` calls write while another connection holds a table lock; meanwhile
    the event loop still runs this coroutine, which is what releases the lock. Had the write
    blocked the loop, this coroutine could not run: the lock would end by the holder's 30 s
    timeout, which the holder reports."""
    locked, release = threading.Event(), threading.Event()
    released: list[bool] = []
    writing = threading.Event()
    flush = aio.Coalescer._flush

    async def noting_flush(self: aio.Coalescer, batch: Any) -> None:
        writing.set()
        await flush(self, batch)

    monkeypatch.setattr(aio.Coalescer, "_flush", noting_flush)
    blocker = threading.Thread(target=hold_write_lock, args=(release, locked, released))
    blocker.start()
    await asyncio.to_thread(locked.wait, 10)
    enqueues = asyncio.gather(*(tasks.noop.aenqueue() for _ in range(50)))
    assert await asyncio.to_thread(writing.wait, 10)  # a write has begun, against the lock
    assert not enqueues.done()  # it cannot end while the lock is held...
    release.set()  # ...and the loop, still running, ends the hold
    results = await asyncio.wait_for(enqueues, 30)
    await asyncio.to_thread(blocker.join)
    assert released == [True]
    assert len(results) == 50
    assert await TaskRecord.objects.acount() == 50
    await close_thread_connections()


class TestEnqueueMany:
    def test_writes_every_call_in_order(self) -> None:
        calls: list[tuple[tuple[int, int], dict[str, Any]]] = [((i, i), {}) for i in range(2500)]
        results = task_backends["default"].enqueue_many(tasks.add, calls)
        assert [r.args for r in results] == [[i, i] for i in range(2500)]
        assert TaskRecord.objects.count() == 2500
        stored = TaskRecord.objects.get(id=results[1234].id)
        assert stored.args == [1234, 1234] and stored.status == TaskResultStatus.READY

    def test_one_bad_call_names_its_index_and_writes_nothing(self) -> None:
        calls: list[Any] = [((1, 2), {}), ((1,), {"b": {1, 2}}), ((3, 4), {})]
        with pytest.raises(InvalidTaskArguments, match=r"calls\[1\]: .*kwargs\['b'\]"):
            task_backends["default"].enqueue_many(tasks.add, calls)
        assert not TaskRecord.objects.exists()

    def test_malformed_call_is_refused(self) -> None:
        with pytest.raises(TypeError, match=r"calls\[0\] must be an \(args, kwargs\) pair"):
            task_backends["default"].enqueue_many(tasks.add, [(1, 2, 3)])

    @pytest.mark.django_db(transaction=True)
    def test_joins_the_callers_transaction(self) -> None:
        def enqueue_then_fail() -> None:
            with transaction.atomic():
                task_backends["default"].enqueue_many(tasks.noop, [((), {})] * 10)
                raise RuntimeError

        with pytest.raises(RuntimeError):
            enqueue_then_fail()
        assert not TaskRecord.objects.exists()

    @pytest.mark.django_db(transaction=True)
    async def test_aenqueue_many_commits_on_its_own(self) -> None:
        results = await task_backends["default"].aenqueue_many(tasks.noop, [((), {})] * 100)
        assert len(results) == 100
        assert await TaskRecord.objects.acount() == 100
        await close_thread_connections()


@pytest.mark.django_db(transaction=True)
class TestEnqueueOnCommit:
    @pytest.fixture(autouse=True)
    def on_commit(self, settings: Any) -> None:
        set_backend_options(settings, ENQUEUE_ON_COMMIT=True)

    def test_waits_for_commit(self) -> None:
        with transaction.atomic():
            result = tasks.noop.enqueue()
            assert not TaskRecord.objects.filter(id=result.id).exists()
        assert TaskRecord.objects.filter(id=result.id).exists()

    def test_never_writes_on_rollback(self) -> None:
        def enqueue_then_fail() -> None:
            with transaction.atomic():
                tasks.noop.enqueue()
                raise RuntimeError

        with pytest.raises(RuntimeError):
            enqueue_then_fail()
        assert not TaskRecord.objects.exists()

    def test_writes_at_once_outside_a_transaction(self) -> None:
        result = tasks.noop.enqueue()
        assert TaskRecord.objects.filter(id=result.id).exists()


@pytest.mark.django_db(transaction=True)
def test_sync_enqueue_is_one_statement() -> None:
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        tasks.noop.enqueue()
        tasks.noop.enqueue()
    # MySQL: the first enqueue on a connection also reads max_allowed_packet, once.
    assert len(queries) == (3 if connection.vendor == "mysql" else 2)


@pytest.mark.django_db(transaction=True)
async def test_a_failing_task_enqueued_receiver_fails_only_its_own_aenqueue() -> None:
    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        if task_result.args == [13, 0]:
            raise RuntimeError("receiver refused task 13")

    task_enqueued.connect(receiver)
    try:
        outcomes = await asyncio.gather(
            *(tasks.add.aenqueue(i, 0) for i in range(20)), return_exceptions=True
        )
    finally:
        task_enqueued.disconnect(receiver)
    failed = [o for o in outcomes if isinstance(o, Exception)]
    assert [str(e) for e in failed] == ["receiver refused task 13"]
    # The row was written before its receiver ran, as with a sync enqueue().
    count = await TaskRecord.objects.filter(task_path=tasks.add.module_path).acount()
    assert count == 20
    await close_thread_connections()


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "mysql", reason="max_allowed_packet is MySQL's")
async def test_a_coalesced_batch_over_max_allowed_packet_is_split(settings: Any) -> None:
    """Each row fits the server's max_allowed_packet, their batch does not: it is written as
    several INSERTs, and every caller gets its row."""
    set_backend_options(settings, MAX_PAYLOAD_BYTES=None)

    def packet() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@max_allowed_packet")
            return int(cursor.fetchone()[0])

    size = await sync_to_async(packet)() // 8
    results = await asyncio.gather(*(tasks.echo.aenqueue("x" * size) for _ in range(20)))
    ids = {r.id for r in results}
    count = await TaskRecord.objects.filter(id__in=ids).acount()
    await close_thread_connections()
    assert count == 20


async def enqueue_view(request: HttpRequest) -> JsonResponse:
    result = await tasks.add.aenqueue(1, 2)
    fetched = await tasks.add.aget_result(result.id)
    return JsonResponse({"id": result.id, "status": fetched.status})


urlpatterns = [path("enqueue/", enqueue_view)]


@pytest.mark.django_db
def test_an_async_view_s_enqueue_is_rolled_back_with_the_test(settings: Any) -> None:
    settings.ROOT_URLCONF = __name__
    response = Client().get("/enqueue/")
    assert response.json()["status"] == "READY"  # read back inside the test's transaction
    task_id = response.json()["id"]
    assert TaskRecord.objects.filter(pk=task_id).exists()
    other = connections.create_connection("default")  # sees only what was committed
    try:
        with other.cursor() as cursor:
            cursor.execute(
                f"SELECT COUNT(*) FROM {TaskRecord._meta.db_table} WHERE id = %s",
                [TaskRecord._meta.pk.get_db_prep_value(uuid.UUID(task_id), other)],
            )
            assert cursor.fetchone()[0] == 0, "the row was committed beside the test"
    finally:
        other.close()
