"""MySQL and MariaDB's ``max_allowed_packet``: the largest statement the server accepts.

A larger INSERT is not refused with an error the caller can read: the server drops the
connection (error 2006, "server has gone away"), and the connection is dead for whatever the
caller does next. So the size of each INSERT is worked out before it is sent, against the
server's value, read once per connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from .sql import NewTask

# Bytes of an INSERT besides its JSON arguments: the statement text, the id, the task path,
# the queue and backend names, dates. Generous, so a statement that passes is sent whole.
ROW_OVERHEAD = 4096
STATEMENT_OVERHEAD = 1024  # bytes of "INSERT INTO ... VALUES" once per statement
# The attribute that caches the server's value on a DB-API connection object, so a new
# connection (after a reconnect, or CONN_MAX_AGE) reads it again.
CACHE_ATTRIBUTE = "_sqltasks_max_allowed_packet"
# Asked of the server once per connection; a read of a variable, not a query of the tables.
MAX_ALLOWED_PACKET_SQL = "SELECT @@max_allowed_packet"


def max_allowed_packet(connection: Any) -> int | None:
    """The server's ``max_allowed_packet`` in bytes on MySQL/MariaDB; None elsewhere."""
    if connection.vendor != "mysql":
        return None
    connection.ensure_connection()
    raw = connection.connection
    cached: int | None = getattr(raw, CACHE_ATTRIBUTE, None)
    if cached is None:
        with connection.cursor() as cursor:
            cursor.execute(MAX_ALLOWED_PACKET_SQL)
            cached = int(cursor.fetchone()[0])
        # A driver object that takes no attributes is asked each time instead.
        with contextlib.suppress(AttributeError):
            setattr(raw, CACHE_ATTRIBUTE, cached)
    return cached


def escaped_size(text: str) -> int:
    """Bytes ``text`` takes in a MySQL statement: UTF-8, with the quote and backslash
    characters the driver escapes counted twice (JSON text has no raw control characters)."""
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return size + text.count('"') + text.count("\\") + text.count("'")


def row_size(row: NewTask) -> int:
    """Bytes ``row`` adds to an INSERT statement."""
    return escaped_size(row.args_json) + escaped_size(row.kwargs_json) + ROW_OVERHEAD


def statements(rows: Sequence[NewTask], limit: int) -> Iterator[Sequence[NewTask]]:
    """Split ``rows`` into runs whose INSERT stays under ``limit`` bytes (a row over it alone is
    yielded alone: callers check single rows first, with ``row_size``)."""
    start, size = 0, STATEMENT_OVERHEAD
    for index, row in enumerate(rows):
        extra = row_size(row)
        if index > start and size + extra > limit:
            yield rows[start:index]
            start, size = index, STATEMENT_OVERHEAD
        size += extra
    if start < len(rows):
        yield rows[start:]
