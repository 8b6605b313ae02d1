"""PostgreSQL on the worker's event loop: ``LISTEN`` and the claim run on psycopg 3's async
connections, so that a ``NOTIFY`` reaches the claim loop, and a claim's rows reach the executor,
with no thread hand-off (three fewer wake-ups between an enqueue and its task's start).

Used only where the database is PostgreSQL through psycopg 3, and only for the main claim: the
limited claim, the requeues and everything else stay on the worker's database thread, which is
also where a claim falls back to while this one's connection is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

from ..sql import ClaimedRow, Scope, dialect_for
from ..sql.postgresql import PostgreSQLDialect

logger = logging.getLogger("django_sqltasks")

RECONNECT_DELAY = 1.0  # seconds between attempts to open a connection that failed


class LoopDatabase:
    """The worker's two connections on its event loop: one listening, one claiming. Every
    method and field belongs to the loop thread."""

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
    ) -> None:
        self.database = database
        self.backend_name = backend_name
        self.queue_names = queue_names
        self.worker_id = worker_id
        self.scope = scope
        self._on_wake = on_wake
        self._listen = listen
        dialect = dialect_for(connections[database])
        assert isinstance(dialect, PostgreSQLDialect)
        self.dialect = dialect
        self._params: dict[str, Any] = {}
        self._session: list[tuple[str, list[Any]]] = []  # time zone and role, as Django sets
        self._claimer: Any = None  # the claim's AsyncConnection, None while down
        self._retry_at = 0.0  # monotonic time before which a lost claim connection stays down
        self._listener: asyncio.Task[None] | None = None
        self.claims = 0  # claims run here (the tests read it)

    @staticmethod
    def available(database: str) -> bool:
        """Whether ``database`` is PostgreSQL through psycopg 3 (the async driver)."""
        if not dialect_for(connections[database]).async_driver:
            return False
        try:
            import psycopg  # noqa: F401
        except ImportError:  # psycopg2: the threads do it all
            return False
        return True

    async def start(self) -> None:
        """Read the connection settings (on the loop, from Django's settings: no query) and
        start listening; the claim connection opens at the first claim."""
        from ..pg import connection_params

        self._params = connection_params(self.database)
        self._session = self.dialect.session_statements()
        if self._listen:
            self._listener = asyncio.get_running_loop().create_task(
                self._listen_forever(), name="sqltasks-listen"
            )

    @property
    def ready(self) -> bool:
        """Whether a claim may run here now (else on the database thread)."""
        return self._claimer is not None or time.monotonic() >= self._retry_at

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
        )
        try:
            if self._claimer is None:
                self._claimer = await self._connect()
            rows = await self._run(self._claimer, sql, params)
        except BaseException:
            await self._drop_claimer()
            raise
        self.claims += 1
        return rows

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(BaseException):  # cancelled, or failed: over either way
                await self._listener
            self._listener = None
        await self._drop_claimer()

    # Inside ------------------------------------------------------------------------------

    async def _connect(self) -> Any:
        import psycopg

        connection = await psycopg.AsyncConnection.connect(
            **self._params, autocommit=True, cursor_factory=psycopg.AsyncClientCursor
        )
        try:
            for sql, params in self._session:
                await connection.execute(sql, params)
        except BaseException:
            await connection.close()
            raise
        return connection

    async def _run(self, connection: Any, sql: str, params: list[Any]) -> list[ClaimedRow]:
        import psycopg

        if connection.prepare_threshold is None:
            async with connection.cursor() as cursor:
                await cursor.execute(sql, params)
                row = await cursor.fetchone()
        else:
            # Prepared where the project turned psycopg's prepared statements on (OPTIONS
            # prepare_threshold), as the database thread's claim is: server-side binding.
            async with psycopg.AsyncCursor(connection) as cursor:
                await cursor.execute(sql, params, prepare=True)
                row = await cursor.fetchone()
        assert row is not None  # json_agg() returns one row, NULL when nothing was claimed
        return self.dialect.claimed_rows(row[0])

    async def _drop_claimer(self) -> None:
        connection, self._claimer = self._claimer, None
        self._retry_at = time.monotonic() + RECONNECT_DELAY
        if connection is not None:
            with contextlib.suppress(Exception):  # broken already
                await connection.close()

    async def _listen_forever(self) -> None:
        while True:
            try:
                connection = await self._connect()
                async with connection:
                    await connection.execute(PostgreSQLDialect.listen_sql)
                    self._on_wake(None)  # anything sent while we were not listening
                    async for notify in connection.notifies():
                        self._on_wake(notify.payload or None)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                logger.warning("Listening for new tasks failed (%s); polling until it is back", e)
            await asyncio.sleep(RECONNECT_DELAY)
