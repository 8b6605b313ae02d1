"""Connection settings for the PostgreSQL connections opened outside Django's own."""

from __future__ import annotations

from collections.abc import Sequence
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
