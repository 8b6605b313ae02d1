"""The supervisor's ``LISTEN`` connection (PostgreSQL), used without ever blocking its loop: it
is opened on a thread of its own (``open_link``), then its statements are sent and their
results read as its socket becomes readable, one statement at a time, beside the
notifications it brings."""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ...sql import wake_ring
from ...sql.postgresql import PostgreSQLDialect

Done = Callable[[list[Any]], None]  # called with a statement's results (psycopg PGresults)


class LinkLost(Exception):
    """The connection failed, or a statement on it did."""


class Link:
    """An open connection that holds slot ``slot`` of the ring ``key`` (and the head lock if
    ``head``). Every method belongs to the supervisor thread."""

    def __init__(self, connection: Any, key: int, slot: int, head: bool) -> None:
        self.connection = connection  # a psycopg Connection, only used through its pgconn
        self.key, self.slot, self.head = key, slot, head
        self.fd: int = connection.fileno()
        self._pgconn = connection.pgconn
        self._pgconn.nonblocking = 1
        self._queue: deque[tuple[bytes, Done | None]] = deque()
        self._busy = False  # a statement was sent and its results are not all read
        self._done: Done | None = None
        self._results: list[Any] = []

    def send(self, sql: str, done: Done | None = None) -> None:
        """Run ``sql`` after the statements sent before it; ``done`` gets its results."""
        self._queue.append((sql.encode(), done))
        self._next()

    def notify(self, channel: str, payload: str) -> None:
        from psycopg import pq  # optional dependency (the postgres extra)

        literal = pq.Escaping(self._pgconn).escape_literal(payload.encode()).decode()
        self.send(f"NOTIFY {channel}, {literal}")

    def read(self) -> list[tuple[str, str]]:
        """Read what the server sent: finish the statements it answered; return the
        notifications, (channel, payload) each. Raise ``LinkLost`` if the connection broke."""
        from psycopg import pq  # optional dependency (the postgres extra)

        pgconn = self._pgconn
        try:
            pgconn.consume_input()
            pgconn.flush()
            while self._busy and not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:  # the statement's last result was read
                    self._busy = False
                    done, results, self._done, self._results = self._done, self._results, None, []
                    if done is not None:
                        done(results)
                    self._next()
                elif result.status == pq.ExecStatus.FATAL_ERROR:
                    message = (result.error_message or b"").decode("utf-8", "replace")
                    raise LinkLost(message.strip() or "a statement failed")
                else:
                    self._results.append(result)
        except LinkLost:
            raise
        except Exception as e:  # the server went away
            raise LinkLost(str(e)) from e
        if pgconn.status != pq.ConnStatus.OK:
            raise LinkLost("the connection is closed")
        notifications = []
        while (notify := pgconn.notifies()) is not None:
            notifications.append((notify.relname.decode(), notify.extra.decode("utf-8", "replace")))
        return notifications

    def close(self) -> None:
        with contextlib.suppress(Exception):  # broken already
            self.connection.close()

    def _next(self) -> None:
        if self._busy or not self._queue:
            return
        sql, self._done = self._queue.popleft()
        try:
            self._pgconn.send_query(sql)
            self._pgconn.flush()
        except Exception as e:
            self._done = None
            raise LinkLost(str(e)) from e
        self._busy = True


def open_link(params: dict[str, Any], key: int) -> Future[Link]:
    """Open the connection on a thread, take a slot of ring ``key`` and listen on its channel
    (and on the enqueue's, with the head lock, if free); the future holds the link."""
    future: Future[Link] = Future()

    def run() -> None:
        try:
            link = _open(params, key)
        except BaseException as e:
            future.set_exception(e)
            return
        future.set_result(link)

    threading.Thread(target=run, name="sqltasks-relay-connect", daemon=True).start()
    return future


def _open(params: dict[str, Any], key: int) -> Link:
    import psycopg  # optional dependency (the postgres extra)

    connection = psycopg.connect(**params, autocommit=True)
    try:
        row = connection.execute(wake_ring.take_slot_sql(key)).fetchone()
        if row is None:
            raise LinkLost(f"every one of the ring's {wake_ring.SLOTS} slots is taken")
        slot = int(row[0])
        head = connection.execute(wake_ring.take_head_sql(key)).fetchone()
        connection.execute(f"LISTEN {wake_ring.slot_channel(key, slot)}")
        if head and head[0]:
            connection.execute(PostgreSQLDialect.listen_sql)
    except BaseException:
        connection.close()
        raise
    return Link(connection, key, slot, bool(head and head[0]))
