"""MySQL and MariaDB's ``max_allowed_packet``: the largest statement the server accepts.

A larger INSERT is not refused with an error the caller can read: the server drops the
connection (error 2006, "server has gone away"), and the connection is dead for whatever the
caller does next. So the size of each INSERT is worked out before it is sent, against the
server's value, read once per connection.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from . import NewTask, dialect_for

# Bytes of an INSERT besides its JSON arguments: the statement text, the id, the task path,
# the queue and backend names, dates. Generous, so a statement that passes is sent whole.
ROW_OVERHEAD = 4096
STATEMENT_OVERHEAD = 1024  # bytes of "INSERT INTO ... VALUES" once per statement


def max_allowed_packet(connection: Any) -> int | None:
    """The server's ``max_allowed_packet`` in bytes on MySQL/MariaDB; None elsewhere."""
    return dialect_for(connection).max_statement_bytes()


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
