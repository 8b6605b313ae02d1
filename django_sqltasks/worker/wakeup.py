"""Waking an idle worker when a task is enqueued, instead of waiting for its next poll.

PostgreSQL: ``LISTEN``/``NOTIFY`` (the enqueue's INSERT notifies, so the message arrives at
commit), on the worker's event loop (``worker/native.py``). SQLite: enqueues in the same
process wake workers directly, and a thread waits for writes to the database files (inotify on
Linux) or else polls ``PRAGMA data_version``, which changes when another process commits. MySQL
has neither; its workers poll, faster while work keeps arriving. Polling stays on everywhere as
the fallback.
"""

from __future__ import annotations

import logging
import os
import select
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

from ..enqueue import wakeup as local
from ..enqueue.wakeup import OnWake
from ..sql import dialect_for
from ..sql.sqlite import DATA_VERSION_SQL

logger = logging.getLogger("django_sqltasks")

WAIT_TIMEOUT = 1.0  # seconds between checks for a stop while waiting
SQLITE_PROBE_INTERVAL = 0.002  # seconds between PRAGMA data_version checks
# After a write to the files, how long (seconds) and how often the wake-up thread looks for the
# commit it may belong to: a WAL commit becomes visible only after its fsync, which inotify does
# not report (the write that makes it visible goes to the memory-mapped -shm file).
SQLITE_SETTLE_WINDOW = 0.05
SQLITE_SETTLE_INTERVAL = 0.0005


class Wakeup:
    """Calls ``on_wake`` from a background thread when new tasks may be due."""

    def __init__(self, database: str, on_wake: OnWake) -> None:
        self.database = database
        self.on_wake = on_wake
        self._stop = threading.Event()  # set by stop(), read by the wake-up thread
        # Set by start() and cleared by stop(), both on the worker's loop thread; the wake-up
        # thread only reads the pipe's read end, which stop() closes after joining it.
        self._thread: threading.Thread | None = None
        self._pipe: tuple[int, int] | None = None  # written to by stop(): ends a wait at once

    def start(self) -> None:
        local.listen(self.database, self.on_wake)
        target = self._target()
        if target is not None:
            self._pipe = os.pipe()
            self._thread = threading.Thread(target=target, name="sqltasks-wakeup", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        local.unlisten(self.database, self.on_wake)
        self._stop.set()
        if self._pipe is not None:
            os.write(self._pipe[1], b"x")
        if self._thread is not None:
            self._thread.join(timeout=WAIT_TIMEOUT + 1)
            if self._thread.is_alive():
                return  # leave its pipe open: it may still wait on it
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None

    def _target(self) -> Callable[[], None] | None:
        return None

    def _wait(self, source: Any) -> bool:
        """Wait up to WAIT_TIMEOUT for ``source`` (a file descriptor or object with one) to
        be readable; return False at once on a stop."""
        assert self._pipe is not None
        readable, _, _ = select.select([source, self._pipe[0]], [], [], WAIT_TIMEOUT)
        return source in readable and not self._stop.is_set()


class SQLiteProbe(Wakeup):
    """Wake on commits of other processes to the database file.

    On Linux, inotify reports each write to the database, its WAL or its journal, so the
    thread sleeps until one happens. Elsewhere (or where inotify is unavailable), it polls
    ``PRAGMA data_version``, which changes when another connection commits, every
    ``SQLITE_PROBE_INTERVAL``.
    """

    def _target(self) -> Callable[[], None] | None:
        name = str(connections[self.database].settings_dict["NAME"])
        if not name or name == ":memory:" or name.startswith("file::memory:"):
            return None
        if name.startswith("file:"):
            return self._prober(name)
        # Opened and read before the watch begins: its first read may create the -wal and -shm
        # files, events that are its own. A commit made between that read and the watch is
        # found by the worker's first claim, which comes after start().
        reader, last = _version_reader(name)
        watcher = _watch_directory(name)
        if watcher is None:
            if reader is not None:
                reader.close()
            return self._prober(name)
        return lambda: self._watch(watcher, name, reader, last)

    def _watch(
        self, watcher: Any, name: str, reader: sqlite3.Connection | None, last: int | None
    ) -> None:
        """Wake once per commit another connection makes, when it has become visible: a write
        to the files is the sign, ``PRAGMA data_version`` on ``reader`` the proof. Woken at the
        write only, a worker would claim before a commit waiting for its fsync
        (``synchronous=FULL``, SQLite's default) is visible, find nothing, and wait for its
        next poll. Without a ``reader``, every write wakes it."""
        base = os.path.basename(name)
        names = {base, f"{base}-wal", f"{base}-journal"}
        try:
            while not self._stop.is_set():
                if self._wait(watcher) and any(
                    event.name in names for event in watcher.read(timeout=0)
                ):
                    if reader is None:
                        self.on_wake(None)
                    else:
                        last = self._settle(reader, last)
        finally:
            watcher.close()
            if reader is not None:
                reader.close()

    def _settle(self, connection: sqlite3.Connection, last: int | None) -> int | None:
        """Wake the worker at a write, and again once the database's version moves past
        ``last`` if it had not yet, looking for up to ``SQLITE_SETTLE_WINDOW``; return the
        version seen. A write that is no commit (a checkpoint, a transaction still open) wakes
        it once, at the write; a look that cannot read the version (the file busy or gone)
        is made again at the next interval."""
        deadline = time.monotonic() + SQLITE_SETTLE_WINDOW
        woken = False
        while True:
            version = _data_version(connection)
            if version is not None and version != last:
                self.on_wake(None)
                return version
            if not woken:
                # Wake now too: the worker's way to its claim overlaps the commit's fsync.
                self.on_wake(None)
                woken = True
            if time.monotonic() >= deadline or self._stop.wait(SQLITE_SETTLE_INTERVAL):
                return last

    def _prober(self, name: str) -> Callable[[], None] | None:
        """The thread that polls ``PRAGMA data_version``, its first look taken now (before
        ``start()`` returns: a commit after it wakes the worker, one before it is the first
        claim's); None if the database cannot be opened (the worker polls)."""
        reader, last = _version_reader(name, uri=name.startswith("file:"))
        if reader is None:
            return None
        return lambda: self._probe(reader, last)

    def _probe(self, reader: sqlite3.Connection, last: int | None) -> None:
        try:
            while not self._stop.wait(SQLITE_PROBE_INTERVAL):
                version = _data_version(reader)
                if version is None:
                    continue
                if last is not None and version != last:
                    self.on_wake(None)
                last = version
        finally:
            reader.close()


def _version_reader(name: str, uri: bool = False) -> tuple[sqlite3.Connection | None, int | None]:
    """A connection of the wake-up thread's own that reads ``PRAGMA data_version``, and its
    first look; (None, None) if the database cannot be opened (then every write wakes the
    worker). Its timeout is 0: a look that meets a lock fails at once and is made again 0.5 ms
    later, where SQLite's busy handler would sleep 1, 2, 5, 10 ms... between its tries."""
    try:
        reader = sqlite3.connect(name, timeout=0, check_same_thread=False, uri=uri)
    except sqlite3.Error as e:
        logger.info("Cannot read %s's version (%s): SQLite workers wake at each write", name, e)
        return None, None
    return reader, _data_version(reader)


def _data_version(connection: sqlite3.Connection) -> int | None:
    """The database's ``PRAGMA data_version`` on ``connection``, or None if it cannot be read."""
    try:
        return int(connection.execute(DATA_VERSION_SQL).fetchone()[0])
    except sqlite3.Error:
        return None


def _watch_directory(path: str) -> Any:
    """An inotify watch of the directory holding ``path``, or None where there is none."""
    try:
        from inotify_simple import INotify, flags  # optional: installed on Linux only
    except ImportError:  # not Linux
        return None
    try:
        watcher = INotify()
    except OSError as e:
        logger.info("inotify is unavailable (%s): SQLite workers poll for commits", e)
        return None
    try:
        # The WAL and journal come and go: watch the directory, not the files.
        watcher.add_watch(
            os.path.dirname(os.path.abspath(path)), flags.MODIFY | flags.CREATE | flags.MOVED_TO
        )
    except OSError as e:
        watcher.close()
        logger.info("Cannot watch %s (%s): SQLite workers poll for commits", path, e)
        return None
    return watcher


def wakeup_for(database: str, on_wake: OnWake) -> Wakeup:
    """Return the way workers on ``database`` learn about new tasks (``Dialect.wakeup``): on
    PostgreSQL the worker's event loop listens itself (``worker/native.py``), so this only
    registers it for the enqueues of its own process."""
    if dialect_for(connections[database]).wakeup == "files":
        return SQLiteProbe(database, on_wake)
    return Wakeup(database, on_wake)
