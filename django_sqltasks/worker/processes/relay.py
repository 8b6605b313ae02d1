"""The supervisor's ``LISTEN``, relayed to its worker processes (PostgreSQL).

One connection listens for every process of ``tasks_worker --processes N`` (their own
connections only claim), and each notification wakes one process, not all of them: the one
with the fewest running tasks, taking turns among equals. A process whose claim took all it
asked for says so (``relayed.MORE``), and the relay wakes another, so a batch enqueued at once
(one notification) reaches as many processes as it needs, one claim after another. Only the
last claim of such a chain finds nothing.

It is the supervisor's: every method and field belongs to the supervisor thread.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from django.db import connections

from ...sql import dialect_for
from ...sql.pg import connection_params
from ...sql.postgresql import PostgreSQLDialect
from .. import events
from ..native import RECONNECT_DELAY, LoopDatabase
from ..relayed import LISTENING, UNHEARD, wake_line
from .child import Child, Children

logger = logging.getLogger("django_sqltasks")

CONNECT_TIMEOUT = 5  # seconds: the supervisor's loop waits for the connection while it opens


class Relay:
    """Listen on ``database`` (through ``listen_database``, reached without a pooler) and wake
    ``children``."""

    def __init__(self, database: str, listen_database: str | None, children: Children) -> None:
        self.database = database
        self.listen_database = listen_database or database
        self._children = children
        self._connection: Any = None  # a psycopg Connection; None while down
        self._fd: int | None = None  # its socket, watched by the children's selector
        self._retry_at = 0.0  # monotonic time before which a lost connection stays down
        self._turn = 0  # where the next wake-up starts looking, among the children
        self.woken = 0  # wake-ups sent (one a notification, and one a "more")

    @staticmethod
    def wanted(database: str, notify: bool) -> bool:
        """Whether a supervisor on ``database`` listens for its processes: PostgreSQL through
        psycopg 3, with NOTIFY on."""
        return (
            notify
            and dialect_for(connections[database]).wakeup == "notify"
            and (LoopDatabase.available(database))
        )

    @property
    def listening(self) -> bool:
        return self._connection is not None

    def tick(self) -> None:
        """Open the connection if it is down and its retry is due; wake the children that
        asked for another process."""
        if self._connection is None and time.monotonic() >= self._retry_at:
            self._connect()
        more, self._children.more[:] = list(self._children.more), []
        for child in more:
            self._wake_one(None, besides=child)

    def started(self, child: Child) -> None:
        """Tell a new child whether the relay listens."""
        child.wake((LISTENING if self.listening else UNHEARD) + b"\n")

    def close(self) -> None:
        self._drop()

    # Inside ------------------------------------------------------------------------------

    def _connect(self) -> None:
        import psycopg  # optional dependency (the postgres extra)

        params = connection_params(self.listen_database)
        params.setdefault("connect_timeout", CONNECT_TIMEOUT)
        try:
            connection = psycopg.connect(**params, autocommit=True)
        except Exception as e:
            self._retry_at = time.monotonic() + RECONNECT_DELAY
            logger.warning("Listening for new tasks failed (%s); the processes poll", e)
            return
        try:
            connection.execute(PostgreSQLDialect.listen_sql)
        except Exception as e:
            connection.close()
            self._retry_at = time.monotonic() + RECONNECT_DELAY
            logger.warning("Listening for new tasks failed (%s); the processes poll", e)
            return
        self._connection, self._fd = connection, connection.fileno()
        self._children.watch(self._fd, self._readable)
        for child in self._children.all():
            # Each claims once now: a task enqueued while nobody listened is found.
            child.wake(LISTENING + b"\n")
        events.emit("relay_listening", database=self.database)

    def _readable(self) -> None:
        connection = self._connection
        if connection is None:
            return
        pgconn = connection.pgconn
        try:
            pgconn.consume_input()
        except Exception as e:  # the server went away: the children poll until it is back
            logger.warning("Listening for new tasks failed (%s); the processes poll", e)
            self._drop()
            return
        while (notify := pgconn.notifies()) is not None:
            self._wake_one(notify.extra.decode("utf-8", "replace") or None)

    def _wake_one(self, queue_name: str | None, besides: Child | None = None) -> None:
        """Wake the child with the fewest running tasks (not ``besides``), taking turns."""
        children = [c for c in self._children.all() if not c.retiring and c is not besides]
        if not children:
            return
        start = self._turn % len(children)
        self._turn += 1
        turn = children[start:] + children[:start]
        chosen = min(turn, key=lambda c: len(c.running))  # the first of the least busy
        if chosen.wake(wake_line(queue_name)):
            self.woken += 1

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        self._retry_at = time.monotonic() + RECONNECT_DELAY
        if self._fd is not None:
            self._children.unwatch(self._fd)
            self._fd = None
        for child in self._children.all():
            child.wake(UNHEARD + b"\n")
        with contextlib.suppress(Exception):  # broken already
            connection.close()
