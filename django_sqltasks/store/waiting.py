"""Waiting for a task to finish: ``result.wait()`` and ``await result.await_result()`` (and
the backend's ``wait_result`` / ``await_result``, which they call).

A wait reads the task's row at once (an already finished task returns with no other cost),
then registers with the process's watcher of the database (``store/finished.py``), which
reads the row again soon (the task may have finished in between), and sleeps until the watcher
wakes it or the timeout runs out. A woken wait reads its row itself, on the caller's
connection; a wait that times out reads it one last time before raising ``WaitTimeout``. An
async wait holds no thread and no connection while it sleeps: only an ``asyncio.Event``.

A read that fails because the connection was lost (a database restart, a failover, a killed
session, an outage) is tried again on a new connection, backing off from 50 ms to 2 s, until the
wait's timeout: the task may well finish meanwhile, and its caller wants its result, not the
fault. A wait inside a transaction cannot reconnect, and raises the error.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections

from ..compat import TaskResult
from ..core.bounds import wait_timeout
from ..exceptions import WaitTimeout
from ..sql import dialect_for
from ..sql.broken import drop
from .finished import Watcher, can_listen, watcher_for

logger = logging.getLogger("django_sqltasks")

T = TypeVar("T")

FIRST_RETRY = 0.05  # seconds before a lost connection is tried again; doubles up to MAX_RETRY
MAX_RETRY = 2.0  # seconds: the pace of the retries while the database stays away


def watcher_of(backend: Any) -> Watcher:
    """The watcher of ``backend``'s database: by LISTEN where it can (PostgreSQL through
    psycopg 3, with the backend's NOTIFY option on; through LISTEN_DATABASE if set), else by
    polling."""
    database = backend.database
    listen = backend.config.notify and can_listen(database)
    return watcher_for(database, listen=listen, listen_database=backend.config.listen_database)


def wait_result(backend: Any, result_id: str, timeout: Any = None) -> TaskResult:
    """Block until task ``result_id`` is SUCCESSFUL or FAILED and return its result; raise
    ``WaitTimeout`` after ``timeout`` seconds (None: no limit)."""
    limit = wait_timeout(timeout)
    deadline = None if limit is None else time.monotonic() + limit
    result = _ride_out(backend, lambda: backend.get_result(result_id), deadline)
    if result.is_finished:
        return result
    _remaining(result, deadline, limit)  # timeout=0: no watcher for nothing
    woken = threading.Event()
    watcher = watcher_of(backend)
    waiter = watcher.add(result.id, woken.set)
    try:
        while True:
            if woken.wait(_remaining(result, deadline, limit)):
                woken.clear()
                watcher.rearm(waiter)
            result = _read(backend, result, deadline, limit)
            if result.is_finished:
                return result
    finally:
        watcher.remove(waiter)


async def await_result(backend: Any, result_id: str, timeout: Any = None) -> TaskResult:
    """Async ``wait_result``: sleeps on an ``asyncio.Event``, with no thread or connection."""
    limit = wait_timeout(timeout)
    deadline = None if limit is None else time.monotonic() + limit
    result = await _aride_out(backend, lambda: backend.aget_result(result_id), deadline)
    if result.is_finished:
        return result
    _remaining(result, deadline, limit)
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()
    watcher = watcher_of(backend)

    def wake() -> None:  # on the watcher's thread
        loop.call_soon_threadsafe(woken.set)

    waiter = watcher.add(result.id, wake)
    try:
        while True:
            remaining = _remaining(result, deadline, limit)  # WaitTimeout is a TimeoutError
            try:
                await asyncio.wait_for(woken.wait(), remaining)
            except asyncio.TimeoutError:
                pass  # the last read, then WaitTimeout
            else:
                woken.clear()
                watcher.rearm(waiter)
            try:
                result = await _aride_out(backend, lambda: backend.aget_result(result_id), deadline)
            except DatabaseError as e:
                _timed_out_by(e, result, deadline, limit)
                raise
            if result.is_finished:
                return result
    finally:
        watcher.remove(waiter)


def _read(backend: Any, result: TaskResult, deadline: float | None, limit: float | None) -> Any:
    try:
        return _ride_out(backend, lambda: backend.get_result(result.id), deadline)
    except DatabaseError as e:
        _timed_out_by(e, result, deadline, limit)
        raise


def _ride_out(backend: Any, read: Callable[[], T], deadline: float | None) -> T:
    """Return ``read()``, trying again on a new connection while it fails because the
    connection was lost, until ``deadline`` (then the error is raised)."""
    attempt = 0
    while True:
        try:
            return read()
        except DatabaseError as e:
            attempt += 1
            delay = _retry_delay(backend, e, attempt, deadline)
            _close(backend.database)
        threading.Event().wait(delay)


async def _aride_out(backend: Any, read: Callable[[], Awaitable[T]], deadline: float | None) -> T:
    """``_ride_out`` for an async read (on PostgreSQL, a pool on the loop that drops a broken
    connection itself; elsewhere, Django's connection of ``sync_to_async``'s thread)."""
    attempt = 0
    while True:
        try:
            return await read()
        except DatabaseError as e:
            attempt += 1
            delay = _retry_delay(backend, e, attempt, deadline)
            # sync_to_async's thread: the one whose connection the read used.
            await sync_to_async(_close)(backend.database)
        await asyncio.sleep(delay)


def _retry_delay(backend: Any, error: DatabaseError, attempt: int, deadline: float | None) -> float:
    """How long to wait before trying ``error``'s read again; raise ``error`` if it is not a
    lost connection, or if the wait's time is up."""
    connection = connections[backend.database]
    if not dialect_for(connection).is_transient(error) or connection.in_atomic_block:
        raise error
    if attempt == 1:
        logger.warning(
            "Waiting for a task: reading its result failed (%s); trying again on a new "
            "connection until the wait's timeout",
            error,
            extra={"action": "wait_retry"},
        )
        # The connection was lost before this read, perhaps long before the wait began (an
        # idle session killed): one read on a new one is tried at once, even with no time left.
        return 0.0
    delay = min(MAX_RETRY, FIRST_RETRY * 2 ** (attempt - 2)) * (0.5 + random.random() / 2)
    if deadline is not None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise error
        delay = min(delay, remaining)
    return delay


def _close(database: str) -> None:
    """Drop this thread's connection (broken), so that the next read opens a new one."""
    drop(connections[database])


def _remaining(result: TaskResult, deadline: float | None, limit: float | None) -> float | None:
    """The seconds left to wait; raise ``WaitTimeout`` if none are (after the last read:
    the task may have finished with its notification missed)."""
    if deadline is None:
        return None
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        assert limit is not None
        raise WaitTimeout(result, limit)
    return remaining


def _timed_out_by(
    error: DatabaseError, result: TaskResult, deadline: float | None, limit: float | None
) -> None:
    """Raise ``WaitTimeout`` from ``error`` if the last read (past the deadline) failed."""
    if deadline is not None and time.monotonic() >= deadline:
        assert limit is not None
        raise WaitTimeout(result, limit) from error
