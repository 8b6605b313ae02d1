"""``aenqueue`` without a thread per call: concurrent enqueues on one event loop share INSERTs.

On PostgreSQL with psycopg 3, rows are written on the loop itself through a small async
connection pool (one per event loop, closed when the loop shuts down), unless the connection
of the thread Django's async ORM uses is in a transaction when the loop's first batch is
written (Django's ``TestCase``): then they are written on it, and roll back with it.
Elsewhere (SQLite, MySQL) there is no async driver, so a batch is written by one
``sync_to_async`` call: one thread hop and one INSERT per batch instead of per task.

Either way a batch gathers for one turn of the loop (no timer) and holds at most
``MAX_BATCH`` rows. If a batch INSERT fails, its rows are written one by one, so each caller
gets its own result or its own error.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections

from ..compat import TaskResultDoesNotExist, logs_task_enqueued, task_enqueued
from ..core.backends import SQLBackend
from ..core.receivers import acting, sync_receivers
from ..ids import finished_not_before
from ..sql import NewTask, dialect_for, packet
from ..sql import partitions as layout
from ..sql.broken import drop_if_broken
from ..sql.pg import SmallPool, connection_params
from ..sql.rows import RESULT_COLUMNS
from ..task import result_from_row

logger = logging.getLogger("django_sqltasks")

MAX_BATCH = 500  # rows per INSERT
# A batch this large is written at once, without waiting for the end of the loop's turn, so
# the database writes it while the loop builds the next rows.
EAGER_BATCH = 100
POOL_SIZE = 4  # connections per event loop; batches beyond this wait for one


class Coalescer:
    """Gather rows from concurrent ``aenqueue`` calls on one loop into few INSERTs."""

    def __init__(self, backend: SQLBackend, loop: asyncio.AbstractEventLoop) -> None:
        self.backend = backend
        self.database = backend.database
        self.loop = loop
        self._pending: list[tuple[NewTask, asyncio.Future[None]]] = []
        self._results: dict[Any, Any] = {}  # row id -> TaskResult, for the enqueued signal
        self._scheduled = False
        self._writer: Writer | None = None
        self._writer_task: asyncio.Task[Writer] | None = None

    async def submit(self, row: NewTask, result: Any) -> None:
        """Write ``row`` with whatever else is being enqueued now; raise its own error.

        ``task_enqueued`` is sent for the whole batch in one thread hop once it is written.
        """
        future: asyncio.Future[None] = self.loop.create_future()
        self._pending.append((row, future))
        self._results[row.id] = result
        if len(self._pending) >= EAGER_BATCH:
            batch, self._pending = self._pending, []
            self.loop.create_task(self._flush(batch))
        elif not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._start_flush)  # after the callers of this turn
        await future

    def _start_flush(self) -> None:
        self._scheduled = False
        while self._pending:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            self.loop.create_task(self._flush(batch))

    async def _flush(self, batch: list[tuple[NewTask, asyncio.Future[None]]]) -> None:
        results = [self._results.pop(row.id) for row, _ in batch]
        try:
            writer = await self._get_writer()
            await writer.insert([row for row, _ in batch], self.backend.config.notify)
        except Exception as e:
            if len(batch) > 1:
                await self._flush_one_by_one(batch, results)
                return
            _settle(batch, [e])
            return
        _settle(batch, await self._send_enqueued(results))

    async def _flush_one_by_one(
        self, batch: list[tuple[NewTask, asyncio.Future[None]]], results: list[Any]
    ) -> None:
        """A batch failed: write its rows alone, so only the bad ones fail."""
        try:
            writer = await self._get_writer()
        except Exception as e:  # no connection to the database: every caller gets the error
            _settle(batch, [e] * len(batch))
            return
        errors: list[Exception | None] = []
        for row, _ in batch:
            try:
                await writer.insert([row], self.backend.config.notify)
            except Exception as e:
                errors.append(e)
            else:
                errors.append(None)
        written = [result for result, e in zip(results, errors, strict=True) if e is None]
        sent = iter(await self._send_enqueued(written))
        _settle(batch, [e if e is not None else next(sent) for e in errors])

    async def _send_enqueued(self, results: list[Any]) -> list[Exception | None]:
        """Send ``task_enqueued`` for each written task in one thread hop (none when no
        receiver would act: ``enqueued_unheard``); return each one's receiver error (which
        fails that caller's ``aenqueue`` only: its row is written)."""
        if not results:
            return []
        if enqueued_unheard(type(self.backend)):
            return [None] * len(results)
        try:
            return await sync_to_async(_send_enqueued)(type(self.backend), results)
        except Exception as e:  # the hop itself failed: no caller may wait forever
            return [e] * len(results)

    async def read_result(self, result_id: str) -> Any:
        """Read a result: on the loop on PostgreSQL (the writer's pool), else through Django's
        async path."""
        writer = await self._get_writer()
        return await writer.read_result(self.backend, result_id)

    async def _get_writer(self) -> Writer:
        # Concurrent first batches share one creation, or each would open a pool.
        if self._writer_task is None:
            self._writer_task = self.loop.create_task(Writer.create(self.database, self.loop))
        try:
            self._writer = await asyncio.shield(self._writer_task)
        except Exception:
            self._writer_task = None  # let a later batch try again (database back up?)
            raise
        return self._writer

    async def aclose(self) -> None:
        if self._writer is not None:
            await self._writer.aclose()
            self._writer = None


def _read_result(backend: SQLBackend, result_id: str) -> Any:
    drop_if_broken(connections[backend.database])  # a read before failed on a lost connection
    return backend.get_result(result_id)


def enqueued_unheard(sender: type) -> bool:
    """Whether sending ``task_enqueued`` from ``sender`` would call no receiver that does
    anything: none is connected, or only Django's own, which logs at DEBUG to a logger that
    drops DEBUG (as a project's default LOGGING does). Then a batch skips the send and the
    thread hop it needs. Asked once per batch (it costs what one send does): a receiver
    connected, or the logger's level changed, is seen by the next batch."""
    receivers = sync_receivers(task_enqueued, sender)
    return receivers is not None and not acting(receivers, (logs_task_enqueued,), logging.DEBUG)


def _send_enqueued(sender: type, results: list[Any]) -> list[Exception | None]:
    errors: list[Exception | None] = []
    for result in results:
        try:
            task_enqueued.send(sender, task_result=result)
        except Exception as e:  # raised to that task's caller, as a sync enqueue() would
            errors.append(e)
        else:
            errors.append(None)
    return errors


def _settle(
    batch: list[tuple[NewTask, asyncio.Future[None]]], errors: Sequence[Exception | None]
) -> None:
    """Resolve each caller's future: with its error, or done."""
    for (_, future), error in zip(batch, errors, strict=True):
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


class Writer:
    """Writes batches of rows: natively on PostgreSQL, through one thread hop elsewhere."""

    @staticmethod
    async def create(database: str, loop: asyncio.AbstractEventLoop) -> Writer:
        if dialect_for(connections[database]).async_driver:
            if await sync_to_async(_in_transaction, thread_sensitive=True)(database):
                # Django's TestCase (a sync test calling an async view): write in its
                # transaction, rolled back with it, as a sync enqueue would, not beside it.
                return ThreadWriter(database)
            try:
                return await PostgresWriter.open(database)
            except ImportError:
                logger.info("psycopg 3 is not installed: aenqueue writes through a thread")
        return ThreadWriter(database)

    async def insert(self, rows: Sequence[NewTask], notify: bool) -> None:
        raise NotImplementedError

    async def read_result(self, backend: SQLBackend, result_id: str) -> Any:
        """Read the result ``result_id`` of ``backend``: through Django's async path."""
        return await sync_to_async(_read_result)(backend, result_id)

    async def aclose(self) -> None:
        return None


def _in_transaction(database: str) -> bool:
    """Whether the connection of the thread Django's async ORM uses is in a transaction."""
    return connections[database].in_atomic_block


class ThreadWriter(Writer):
    """One ``sync_to_async`` call (on the thread Django's async ORM uses) per batch."""

    def __init__(self, database: str) -> None:
        self.database = database
        self._insert = sync_to_async(self._insert_sync, thread_sensitive=True)

    def _insert_sync(self, rows: Sequence[NewTask], notify: bool) -> None:
        connection = connections[self.database]
        drop_if_broken(connection)  # a batch before failed on a lost connection
        dialect = dialect_for(connection)
        limit = dialect.max_statement_bytes()
        # A coalesced batch of rows that each fit may not fit as one INSERT (MySQL).
        batches = [rows] if limit is None else list(packet.statements(rows, limit))
        with connection.cursor() as cursor:
            for batch in batches:
                dialect.insert(cursor, batch, notify=notify)

    async def insert(self, rows: Sequence[NewTask], notify: bool) -> None:
        await self._insert(rows, notify)


class PostgresWriter(Writer):
    """A small pool of psycopg async connections on the caller's event loop: the coalescer's
    INSERTs, and ``aget_result``'s reads, which share the pool rather than open one more."""

    def __init__(self, database: str, pool: SmallPool) -> None:
        self.database = database
        self.pool = pool
        self.dialect = dialect_for(connections[database])
        self._partitioned: tuple[bool, float] | None = None  # and when it was looked at

    @classmethod
    async def open(cls, database: str) -> PostgresWriter:
        import psycopg  # noqa: F401  (optional dependency; ImportError: the thread writer)

        setup = dialect_for(connections[database]).session_statements()
        return cls(database, SmallPool(connection_params(database), POOL_SIZE, setup))

    async def insert(self, rows: Sequence[NewTask], notify: bool) -> None:
        sql, params = self.dialect.insert_statement(rows, notify)
        # psycopg's errors become Django's (OperationalError, ...), as on the sync path.
        with connections[self.database].wrap_database_errors:
            async with self.pool.connection() as connection:
                await connection.execute(sql, params)

    async def read_result(self, backend: SQLBackend, result_id: str) -> Any:
        """Read the result ``result_id`` of ``backend`` on a connection of the pool."""
        try:
            task_id = uuid.UUID(str(result_id))
        except ValueError as e:
            raise TaskResultDoesNotExist(result_id) from e
        columns = RESULT_COLUMNS  # every column of the task table (a test holds it to the model)
        with connections[self.database].wrap_database_errors:
            async with self.pool.connection() as connection:
                earliest = finished_not_before(task_id)
                if earliest is not None and await self._is_partitioned(connection):
                    sql = self.dialect.select_result_sql(columns, pruned=True)
                    cursor = await connection.execute(sql, [task_id, backend.alias, earliest])
                else:
                    sql = self.dialect.select_result_sql(columns)
                    cursor = await connection.execute(sql, [task_id, backend.alias])
                values = await cursor.fetchone()
        if values is None:
            raise TaskResultDoesNotExist(result_id)
        return result_from_row(dict(zip(columns, values, strict=True)))

    async def _is_partitioned(self, connection: Any) -> bool:
        """Whether the task table is partitioned, looked up at most once every
        ``LAYOUT_RECHECK`` seconds (a stale answer costs only speed)."""
        now = time.monotonic()
        if self._partitioned is None or now - self._partitioned[1] > layout.LAYOUT_RECHECK:
            cursor = await connection.execute(layout.KIND_SQL, [self.dialect.tasks])
            row = await cursor.fetchone()
            self._partitioned = (row is not None and row[0] == "p", now)
        return self._partitioned[0]

    async def aclose(self) -> None:
        await self.pool.close()


_coalescers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Coalescer]] = (
    weakref.WeakKeyDictionary()
)


async def coalescer_for(backend: SQLBackend) -> Coalescer:
    """Return this loop's coalescer for ``backend``, closing it when the loop shuts down."""
    loop = asyncio.get_running_loop()
    per_loop = _coalescers.get(loop)
    if per_loop is None:
        per_loop = _coalescers[loop] = {}
    coalescer = per_loop.get(backend.alias)
    if coalescer is None:
        coalescer = per_loop[backend.alias] = Coalescer(backend, loop)
        await _close_at_loop_shutdown(coalescer.aclose)
    return coalescer


_keep_alive: set[AsyncIterator[None]] = set()


async def _close_at_loop_shutdown(close: Callable[[], Any]) -> None:
    """Run ``close`` when the loop finalizes async generators (``asyncio.run`` does, at exit)."""

    async def closer() -> AsyncIterator[None]:
        try:
            yield
        finally:
            _keep_alive.discard(agen)
            await close()

    agen = closer()
    _keep_alive.add(agen)
    await agen.__anext__()
