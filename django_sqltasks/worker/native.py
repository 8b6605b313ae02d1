"""PostgreSQL on the worker's event loop: ``LISTEN`` and the main claim share one psycopg 3 async
connection driven by the loop, so that a ``NOTIFY`` reaches the claim loop, and a claim's rows
reach the executor, with no thread hand-off (three fewer wake-ups between an enqueue and its
task's start), and the worker keeps to two connections of its own (this one and its
database thread's).

Between claims the loop watches the connection's socket and reads notifications as they come;
during a claim psycopg reads the socket, and hands notifications to a handler. The limited
claim, requeues and everything else stay on the worker's database thread, which is also where a
claim falls back to while this connection is down.

Behind a pooler in transaction mode a ``LISTEN`` would not stay on one server session, so
``OPTIONS["LISTEN_DATABASE"]`` may name another alias of the same database, reached directly:
this connection (its ``LISTEN`` and its claim) opens there, and everything else goes through
the pooler. A worker process of ``tasks_worker --processes`` does not listen: its supervisor
does, for all of them (``worker/relayed.py``), and its connection here only claims, through
the pooler if there is one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from time import perf_counter  # the claim's timing, apart from the clock of the reconnects
from typing import Any

from django.db import connections

from ..sql import ClaimedRow, Scope, dialect_for, postgresql_dialect
from ..sql.marks import ClaimMarks
from ..sql.pg import connection_params, open_async
from ..sql.postgresql import PostgreSQLDialect
from ..sql.postgresql_claims import claim_feedback
from . import events
from .claim_meter import ClaimMeter

logger = logging.getLogger("django_sqltasks")

RECONNECT_DELAY = 1.0  # seconds between attempts to open a connection that failed
# psycopg's own default, for the listening connection where the project's OPTIONS leave
# prepared statements off: only the claim asks to be prepared (prepare=True); the connection's
# other statements (LISTEN, the session's settings) run once and are never prepared.
LISTEN_PREPARE_THRESHOLD = 5


class LoopDatabase:
    """The worker's connection on its event loop. Every method and field belongs to the loop
    thread."""

    def __init__(
        self,
        *,
        database: str,
        backend_name: str,
        queue_names: list[str] | None,
        worker_id: str,
        scope: Scope,
        listen: bool,
        on_wake: Callable[[str | None], None],
        on_lost: Callable[[], None] | None = None,
        listen_database: str | None = None,
        direct: bool = False,
        meter: ClaimMeter | None = None,
    ) -> None:
        self.database = database
        # The alias this connection is opened with: to listen, OPTIONS["LISTEN_DATABASE"] (the
        # same database as ``database``, reached without the pooler ``database`` goes
        # through); else ``database`` itself (a worker process whose supervisor listens for
        # it, or NOTIFY = False), through the pooler if there is one.
        self.listen_database = (listen_database or database) if listen else database
        self.backend_name = backend_name
        self.queue_names = queue_names
        self.worker_id = worker_id
        self.scope = scope
        self._on_wake = on_wake
        self._on_lost = on_lost  # told when the connection is lost (any thread may be told)
        self._listen = listen
        # Whether this connection's session is its own, to carry the worker's settings: one
        # that listens is (a direct one); else ``direct``, the backend's DATABASE's sessions
        # are (BackendOptions.direct_sessions).
        self._own_session = listen or direct
        self.dialect = postgresql_dialect(connections[database])
        self._params: dict[str, Any] = {}
        self._session: list[tuple[str, list[Any]]] = []  # time zone and role, as Django sets
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connection: Any = None  # the AsyncConnection; None while down
        self._watched: int | None = None  # the socket the loop watches between claims
        self._retry_at = 0.0  # monotonic time before which a lost connection stays down
        self.marks = ClaimMarks()  # where the main claim starts reading (sql/marks.py)
        self.meter = meter  # times the claim (guards its own fields: any thread may record)

    @staticmethod
    def available(database: str) -> bool:
        """Whether ``database`` is PostgreSQL through psycopg 3 (the async driver)."""
        if not dialect_for(connections[database]).async_driver:
            return False
        try:
            import psycopg  # noqa: F401  # optional dependency (the postgres extra)
        except ImportError:  # psycopg2: the threads do it all
            return False
        return True

    async def start(self) -> None:
        """Read the connection settings (from Django's settings: no query) and, to listen,
        connect now; if that fails, the next claim tries again."""
        self._loop = asyncio.get_running_loop()
        self._params = connection_params(self.listen_database)
        # The tasks database's session (its time zone): the claim's times are read as its.
        self._session = self.dialect.session_statements()
        if self._listen:
            try:
                await self._connect()
            except Exception as e:
                self._retry_at = time.monotonic() + RECONNECT_DELAY
                logger.warning("Listening for new tasks failed (%s); polling until it is back", e)

    @property
    def ready(self) -> bool:
        """Whether a claim may run here now (else on the database thread)."""
        return self._connection is not None or time.monotonic() >= self._retry_at

    @property
    def listening(self) -> bool:
        """Whether every task enqueued from now on wakes this worker (its LISTEN is up)."""
        return self._listen and self._connection is not None

    async def claim(self, limit: int) -> list[ClaimedRow]:
        """Claim up to ``limit`` due tasks of the main scope. On any error the connection is
        dropped (opened again after RECONNECT_DELAY) and the error raised: the claim may or
        may not have committed, and the caller puts back what it does not know it holds."""
        sql, params = self.dialect.claim_sql(
            backend_name=self.backend_name,
            queue_names=self.queue_names,
            worker_id=self.worker_id,
            limit=limit,
            scope=self.scope,
            marks=self.marks.begin(),
        )
        passes = self.marks.full_passes
        try:
            connection = self._connection or await self._connect()
            self._unwatch()  # psycopg reads the socket while the statement runs
            started = perf_counter()
            values = await self._run(connection, sql, params)
        except BaseException:
            self.marks.end(None)
            await self._drop()
            self._lost()
            raise
        self.marks.end(claim_feedback(values))
        self._watch()
        rows = self.dialect.claimed_rows(values[0])
        if self.meter is not None:  # timed as on the database thread: with the rows decoded
            took = perf_counter() - started
            self.meter.record(took, len(rows), full_pass=self.marks.full_passes > passes)
        return rows

    async def close(self) -> None:
        await self._drop()

    # Inside ------------------------------------------------------------------------------

    async def _connect(self) -> Any:
        import psycopg  # optional dependency (the postgres extra)

        connection = await open_async(
            self._params, self._session, cursor_factory=psycopg.AsyncClientCursor
        )
        try:
            if self._listen:
                connection.add_notify_handler(self._notified)  # those read during a claim
                await connection.execute(PostgreSQLDialect.listen_sql)
                # A session that holds LISTEN is a direct one, never behind a pooler in
                # transaction mode (which would lose its notifications): its claim may be a
                # prepared statement, planned once per connection instead of at each call,
                # whatever Django's OPTIONS say for the project's other connections.
                if connection.prepare_threshold is None:
                    connection.prepare_threshold = LISTEN_PREPARE_THRESHOLD
            if connection.prepare_threshold is not None and self._own_session:
                # Its claim is planned once: with the settings that keep that plan on the
                # indexes at any size of the table (sql/prepared.py, as on the database
                # thread).
                for setting, values in self.dialect.worker_session_statements():
                    await connection.execute(setting, values)
        except BaseException:
            await connection.close()
            raise
        self._connection = connection
        self._watch()
        if self._listen:
            self._on_wake(None)  # anything sent while we were not listening
            events.emit("listening", worker_id=self.worker_id)
        return connection

    async def _run(self, connection: Any, sql: str, params: list[Any]) -> tuple[Any, ...]:
        import psycopg  # optional dependency (the postgres extra)

        if connection.prepare_threshold is None:
            async with connection.cursor() as cursor:
                await cursor.execute(sql, params)
                row = await cursor.fetchone()
        else:
            # Prepared on the listening connection, or where the project turned psycopg's
            # prepared statements on (OPTIONS prepare_threshold) as the database thread's
            # claim is: server-side binding.
            async with psycopg.AsyncCursor(connection) as cursor:
                await cursor.execute(sql, params, prepare=True)
                row = await cursor.fetchone()
        assert row is not None  # json_agg() returns one row, NULL when nothing was claimed
        return tuple(row)

    def _notified(self, notify: Any) -> None:
        self._on_wake(notify.payload or None)

    def _watch(self) -> None:
        """Read notifications as they arrive, until the next claim (listening workers only)."""
        if not self._listen or self._connection is None or self._watched is not None:
            return
        assert self._loop is not None
        self._watched = self._connection.fileno()
        self._loop.add_reader(self._watched, self._readable)
        self._readable()  # any that came with the last statement's results

    def _unwatch(self) -> None:
        if self._watched is not None:
            assert self._loop is not None
            self._loop.remove_reader(self._watched)
            self._watched = None

    def _readable(self) -> None:
        connection = self._connection
        if connection is None:
            return
        pgconn = connection.pgconn
        try:
            pgconn.consume_input()
        except Exception as e:  # the server went away: claims fall back until it is back
            logger.warning("Listening for new tasks failed (%s); polling until it is back", e)
            self._unwatch()
            self._connection = None
            self._retry_at = time.monotonic() + RECONNECT_DELAY
            self._loop_close(connection)
            self._lost()
            # Wake the worker, which waits for a notification that cannot come now: it claims
            # on its database thread (a failover: on the new primary), polls, and listens
            # again from its first claim after RECONNECT_DELAY, not after up to POLL_INTERVAL.
            self._on_wake(None)
            return
        while (notify := pgconn.notifies()) is not None:
            self._on_wake(notify.extra.decode("utf-8", "replace") or None)

    def _lost(self) -> None:
        if self._on_lost is not None:
            self._on_lost()

    def _loop_close(self, connection: Any) -> None:
        assert self._loop is not None
        self._loop.create_task(_close_quietly(connection))

    async def _drop(self) -> None:
        self._unwatch()
        connection, self._connection = self._connection, None
        self._retry_at = time.monotonic() + RECONNECT_DELAY
        if connection is not None:
            await _close_quietly(connection)


async def _close_quietly(connection: Any) -> None:
    with contextlib.suppress(Exception):  # broken already
        await connection.close()
