"""Learning when the tasks someone waits on finish (``store/waiting.py``): one watcher per
database and process, shared by every waiter, with one thread and at most one connection.

PostgreSQL (through psycopg 3, with NOTIFY on): the thread holds a connection that LISTENs on
the channel workers notify as they write outcomes (``sql/postgresql.py``), and wakes the
waiters of the ids each notification names. It reads the rows of new waiters once it listens
(their task may have finished just before), the rows of every waiter after it connects again
(notifications sent while it was away are lost), and every SAFETY_POLL seconds (a task can end
with no notification: the last rescue of a lost worker, a workflow step skipped).

Elsewhere the thread polls its waiters' rows, many per query: each one within FIRST_POLL seconds
after it starts waiting, then within twice as long each time, up to MAX_POLL; reads are due at
multiples of their interval, so that waits started apart are read together.

A waiter is woken, not handed its result: it reads its row itself, and waits again if the task
has not finished after all.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import os
import select
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections

from ..sql import dialect_for, postgresql_dialect
from ..sql.pg import connection_params

logger = logging.getLogger("django_sqltasks")

FIRST_POLL = 0.005  # seconds: the first poll of a waiter's row (databases with no NOTIFY)
MAX_POLL = 0.5  # seconds: the longest between two polls of one row
SAFETY_POLL = 5.0  # seconds between reads of every waited row, while listening
IDLE_CLOSE = 10.0  # seconds a watcher with no waiter keeps its thread and connection
CHECK_BATCH = 500  # ids read per query
FIRST_RECONNECT = 0.1  # seconds before connecting again; doubles up to MAX_RECONNECT
MAX_RECONNECT = 5.0
APPLICATION_NAME = "sqltasks-waiters"  # the listening session's name, unless DATABASES sets one


class Waiter:
    """One wait for one task: ``wake`` is called (from the watcher's thread) when it may have
    finished."""

    __slots__ = ("active", "interval", "task_id", "wake")

    def __init__(self, task_id: str, wake: Callable[[], object]) -> None:
        self.task_id = task_id  # the canonical form: str(uuid.UUID(...))
        self.wake = wake
        self.active = True  # False once removed
        self.interval = FIRST_POLL  # the polling watcher's current wait for this one


class Watcher:
    """The waiters of one database, and the thread that wakes them. Any thread may add and
    remove waiters; ``_lock`` guards the registry and the thread's handle."""

    def __init__(self, database: str) -> None:
        self.database = database
        self._lock = threading.Lock()
        self._waiters: dict[str, list[Waiter]] = {}
        self._thread: threading.Thread | None = None
        self._idle_since = time.monotonic()
        self._stopping = False
        # Written to by any thread to end the watcher thread's wait at once.
        self._pipe = os.pipe()
        os.set_blocking(self._pipe[1], False)

    def add(self, task_id: str, wake: Callable[[], object]) -> Waiter:
        """Register a wait for ``task_id``; ``wake`` is called when it may have finished."""
        waiter = Waiter(str(uuid.UUID(str(task_id))), wake)
        with self._lock:
            self._waiters.setdefault(waiter.task_id, []).append(waiter)
            self._added(waiter)
            if self._thread is None:
                self._stopping = False
                self._thread = threading.Thread(
                    target=self._main, name="sqltasks-waiters", daemon=True
                )
                self._thread.start()
        self._poke()
        return waiter

    def remove(self, waiter: Waiter) -> None:
        """End a wait (it returned, raised or timed out)."""
        with self._lock:
            waiter.active = False
            waiters = self._waiters.get(waiter.task_id, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiters.pop(waiter.task_id, None)
            empty = not self._waiters
            if empty:
                self._idle_since = time.monotonic()
        if empty:
            self._poke()

    def rearm(self, waiter: Waiter) -> None:
        """``waiter`` was woken but its task had not finished: keep watching it."""

    @property
    def waiting(self) -> int:
        """How many waits are registered."""
        with self._lock:
            return sum(len(waiters) for waiters in self._waiters.values())

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread now (it starts again at the next wait) and close its connection."""
        with self._lock:
            thread = self._thread
            self._stopping = True
        self._poke()
        if thread is not None:
            thread.join(timeout)

    # Inside ----------------------------------------------------------------------------

    def _added(self, waiter: Waiter) -> None:
        """Called under the lock for each new waiter."""

    def _poke(self) -> None:
        with contextlib.suppress(BlockingIOError):  # full: a wake-up is pending anyway
            os.write(self._pipe[1], b"x")

    def _sleep(self, timeout: float | None, fd: int | None = None) -> bool:
        """Wait up to ``timeout`` seconds for a poke (or for ``fd`` to be readable); return
        whether ``fd`` is readable."""
        sources = [self._pipe[0]] if fd is None else [self._pipe[0], fd]
        readable, _, _ = select.select(sources, [], [], timeout)
        if self._pipe[0] in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(self._pipe[0], 4096)
        return fd is not None and fd in readable

    def _should_exit(self) -> bool:
        """Whether the thread ends now: stopped, or with no waiter for IDLE_CLOSE seconds.
        Clears the thread's handle under the lock, so the next ``add`` starts another."""
        with self._lock:
            idle = not self._waiters and time.monotonic() - self._idle_since >= IDLE_CLOSE
            if self._stopping or idle:
                self._thread = None
                return True
            return False

    def _idle_timeout(self, timeout: float | None) -> float | None:
        """``timeout``, shortened to when the thread may end for want of waiters."""
        with self._lock:
            if self._stopping:
                return 0.0
            if self._waiters:
                return timeout
            left = max(0.0, IDLE_CLOSE - (time.monotonic() - self._idle_since))
        return left if timeout is None else min(timeout, left)

    def _ids(self) -> list[str]:
        with self._lock:
            return list(self._waiters)

    def _wake(self, task_ids: Iterable[str]) -> list[Waiter]:
        """Wake the waiters of ``task_ids``; return them."""
        with self._lock:
            woken = [w for task_id in task_ids for w in self._waiters.get(task_id, ())]
        for waiter in woken:
            try:
                waiter.wake()
            except Exception:  # an event loop closed under its waiter: nothing to wake
                logger.debug("Waking a waiter of task %s failed", waiter.task_id, exc_info=True)
        return woken

    def _finished_among(self, cursor: Any, task_ids: list[str]) -> set[str]:
        dialect = dialect_for(connections[self.database])
        finished: set[str] = set()
        for start in range(0, len(task_ids), CHECK_BATCH):
            batch = [uuid.UUID(task_id) for task_id in task_ids[start : start + CHECK_BATCH]]
            finished |= dialect.finished_among(cursor, batch)
        return finished

    def _main(self) -> None:
        try:
            self._run()
        except BaseException:
            logger.exception("The thread waking waiters of finished tasks failed")
            with self._lock:
                self._thread = None
            raise

    def _run(self) -> None:
        raise NotImplementedError


class ListeningWatcher(Watcher):
    """PostgreSQL: woken by the workers' NOTIFY as they write outcomes. Its connection is
    opened with ``listen_database`` (the backend's LISTEN_DATABASE: the same database, reached
    without a pooler), else with ``database``."""

    def __init__(self, database: str, listen_database: str | None = None) -> None:
        super().__init__(database)
        self.listen_database = listen_database or database
        self._unchecked: set[str] = set()  # new waiters' ids, read once listening
        self.listening = threading.Event()  # set while the connection LISTENs
        self.backend_pid: int | None = None  # the listening session's server process

    def _added(self, waiter: Waiter) -> None:
        self._unchecked.add(waiter.task_id)

    def _run(self) -> None:
        connection: Any = None
        failures = 0
        next_sweep = 0.0
        try:
            while not self._should_exit():
                if connection is None:
                    try:
                        connection = self._connect()
                    except Exception as e:
                        failures += 1
                        delay = min(MAX_RECONNECT, FIRST_RECONNECT * 2 ** (failures - 1))
                        logger.warning(
                            "Listening for finished tasks failed (%s); trying again in %.1fs",
                            e,
                            delay,
                        )
                        self._sleep(self._idle_timeout(delay))
                        continue
                    failures = 0
                    next_sweep = 0.0  # read every row: notifications may have been missed
                try:
                    next_sweep = self._listen_once(connection, next_sweep)
                except Exception as e:
                    logger.warning("Listening for finished tasks failed (%s); reconnecting", e)
                    self.listening.clear()
                    _close_quietly(connection)
                    connection = None
        finally:
            self.listening.clear()
            if connection is not None:
                _close_quietly(connection)

    def _listen_once(self, connection: Any, next_sweep: float) -> float:
        """Read the rows due a read, then wait for a notification; return when to sweep next."""
        now = time.monotonic()
        if now >= next_sweep:
            with self._lock:
                self._unchecked.clear()
            ids = self._ids()
            next_sweep = now + SAFETY_POLL
        else:
            with self._lock:
                ids, self._unchecked = list(self._unchecked), set()
        if ids:
            with connection.cursor() as cursor:
                self._wake(self._finished_among(cursor, ids))
        timeout = self._idle_timeout(max(0.0, next_sweep - time.monotonic()))
        if self._sleep(timeout, connection.fileno()):
            pgconn = connection.pgconn
            pgconn.consume_input()
            while (notify := pgconn.notifies()) is not None:
                self._notified(notify.extra.decode("utf-8", "replace"))
            if connection.closed or connection.broken:
                raise ConnectionError("the server closed the connection")
        return next_sweep

    def _notified(self, payload: str) -> None:
        self._wake(payload.split(","))

    def _connect(self) -> Any:
        import psycopg  # optional dependency (the postgres extra)

        params = connection_params(self.listen_database)
        dialect = postgresql_dialect(connections[self.database])
        session = dialect.session_statements()
        params.setdefault("application_name", APPLICATION_NAME)
        connection = psycopg.connect(**params, autocommit=True)
        try:
            for sql, values in session:
                connection.execute(sql, values)
            # Notifications that arrive while a statement runs come here.
            connection.add_notify_handler(lambda n: self._notified(n.payload))
            connection.execute(dialect.listen_finished_sql)
        except BaseException:
            _close_quietly(connection)
            raise
        self.backend_pid = connection.info.backend_pid
        self.listening.set()
        return connection


class PollingWatcher(Watcher):
    """SQLite, MySQL/MariaDB (and PostgreSQL without LISTEN): polls the waited rows."""

    def __init__(self, database: str) -> None:
        super().__init__(database)
        # (when, tie-breaker, waiter): the next read of each waiter's row; under the lock.
        self._due: list[tuple[float, int, Waiter]] = []
        self._order = itertools.count()

    def _added(self, waiter: Waiter) -> None:
        self._schedule(waiter, time.monotonic())

    def rearm(self, waiter: Waiter) -> None:
        with self._lock:
            if waiter.active:
                self._schedule(waiter, time.monotonic())
        self._poke()

    def _schedule(self, waiter: Waiter, now: float) -> None:
        # At the next multiple of its interval: waits with the same interval share a tick, and
        # so a query (1,000 waits at MAX_POLL: two queries a tick, not one per wait).
        due = (math.floor(now / waiter.interval) + 1) * waiter.interval
        heapq.heappush(self._due, (due, next(self._order), waiter))

    def _take_due(self) -> tuple[list[Waiter], float | None]:
        """The waiters whose row is due a read, and the time of the next one after them."""
        now = time.monotonic()
        due: list[Waiter] = []
        with self._lock:
            while self._due and self._due[0][0] <= now:
                waiter = heapq.heappop(self._due)[2]
                if waiter.active:
                    due.append(waiter)
            return due, self._due[0][0] if self._due else None

    def _run(self) -> None:
        connection = connections[self.database]
        try:
            while not self._should_exit():
                due, next_at = self._take_due()
                if not due:
                    wait = None if next_at is None else max(0.0, next_at - time.monotonic())
                    self._sleep(self._idle_timeout(wait))
                    continue
                self._poll(connection, due)
        finally:
            connection.close()

    def _poll(self, connection: Any, due: list[Waiter]) -> None:
        try:
            with connection.cursor() as cursor:
                finished = self._finished_among(cursor, sorted({w.task_id for w in due}))
        except Exception as e:
            logger.warning("Polling tasks waited on failed (%s); polling again", e)
            connection.close()  # a broken connection is opened again at the next poll
            finished = set()
        self._wake(finished)
        now = time.monotonic()
        with self._lock:
            for waiter in due:
                if waiter.task_id not in finished and waiter.active:
                    waiter.interval = min(MAX_POLL, waiter.interval * 2)
                    self._schedule(waiter, now)


def _close_quietly(connection: Any) -> None:
    with contextlib.suppress(Exception):  # broken already
        connection.close()


# The watchers of this process, by database alias and kind (the alias a listening one opens
# its connection with, None for a polling one); guarded by the lock.
_watchers_lock = threading.Lock()
_watchers: dict[tuple[str, str | None], Watcher] = {}


def watcher_for(database: str, *, listen: bool, listen_database: str | None = None) -> Watcher:
    """This process's watcher of ``database`` (``listen``: by LISTEN, on a connection opened
    with ``listen_database`` if given, else by polling)."""
    key = (database, (listen_database or database) if listen else None)
    with _watchers_lock:
        watcher = _watchers.get(key)
        if watcher is None:
            watcher = _watchers[key] = (
                ListeningWatcher(database, listen_database) if listen else PollingWatcher(database)
            )
        return watcher


def can_listen(database: str) -> bool:
    """Whether ``database`` is PostgreSQL reached through psycopg 3 (which LISTEN needs)."""
    if dialect_for(connections[database]).wakeup != "notify":
        return False
    try:
        import psycopg  # noqa: F401  # optional dependency (the postgres extra)
    except ImportError:  # psycopg2: poll
        return False
    return True


def stop_all() -> None:
    """Stop every watcher's thread and close its connection (tests; a process shutting down)."""
    with _watchers_lock:
        watchers = list(_watchers.values())
    for watcher in watchers:
        watcher.stop()
