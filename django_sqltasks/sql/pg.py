"""The PostgreSQL connections opened outside Django's own (psycopg 3, on an event loop): their
connection settings, one connection that runs Django's session statements first, and a small
pool of them. Their users: the coalescer's pool (``enqueue/coalescer.py``), the worker's
LISTEN and claim connection (``worker/native.py``) and the wait for finished tasks
(``store/finished.py``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from django.db import connections

# Keys Django adds for its own cursor classes and adapters; our plain connections skip them.
DJANGO_ONLY = ("cursor_factory", "context", "server_side_binding")


def connection_params(database: str) -> dict[str, Any]:
    """psycopg ``connect()`` keyword arguments for ``DATABASES[database]``."""
    params = connections[database].get_connection_params()
    for key in DJANGO_ONLY:
        params.pop(key, None)
    return params


async def open_async(
    params: dict[str, Any], setup: Sequence[tuple[str, list[Any]]], **options: Any
) -> Any:
    """A psycopg 3 ``AsyncConnection`` (autocommit) that has run ``setup`` first: the session
    settings Django gives its own connections (``Dialect.session_statements``)."""
    from psycopg import AsyncConnection  # optional dependency (postgres extra)

    connection = await AsyncConnection.connect(**params, autocommit=True, **options)
    try:
        for sql, values in setup:
            await connection.execute(sql, values)
    except BaseException:
        await connection.close()
        raise
    return connection


class SmallPool:
    """At most ``size`` psycopg async connections, opened on demand and reused.

    Not ``psycopg_pool``: its background tasks are cancelled when ``asyncio.run`` ends, before
    async generators are finalized, so it could not close its connections at that point.
    """

    def __init__(
        self, params: dict[str, Any], size: int, setup: Sequence[tuple[str, list[Any]]] = ()
    ) -> None:
        self.params = params
        self.setup = setup  # statements each new connection runs first (Django's session)
        self._idle: list[Any] = []
        self._open: set[Any] = set()
        self._slots = asyncio.Semaphore(size)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        async with self._slots:
            if self._idle:
                connection = self._idle.pop()
            else:
                connection = await open_async(self.params, self.setup)
                self._open.add(connection)
            try:
                yield connection
            finally:
                if connection.closed or connection.broken:
                    self._open.discard(connection)
                else:
                    self._idle.append(connection)

    async def close(self) -> None:
        connections, self._open, self._idle = list(self._open), set(), []
        for connection in connections:
            await connection.close()
