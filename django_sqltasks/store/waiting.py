"""Waiting for a task to finish: ``result.wait()`` and ``await result.await_result()`` (and
the backend's ``wait_result`` / ``await_result``, which they call).

A wait reads the task's row at once (an already finished task returns with no other cost),
then registers with the process's watcher of the database (``store/finished.py``), which
reads the row again soon (the task may have finished in between), and sleeps until the watcher
wakes it or the timeout runs out. A woken wait reads its row itself, on the caller's
connection; a wait that times out reads it one last time before raising ``WaitTimeout``. An
async wait holds no thread and no connection while it sleeps: only an ``asyncio.Event``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from django.db import DatabaseError

from ..compat import TaskResult
from ..core.bounds import wait_timeout
from ..exceptions import WaitTimeout
from .finished import Watcher, can_listen, watcher_for


def watcher_of(backend: Any) -> Watcher:
    """The watcher of ``backend``'s database: by LISTEN where it can (PostgreSQL through
    psycopg 3, with the backend's NOTIFY option on), else by polling."""
    database = backend.database
    listen = backend.config.notify and can_listen(database)
    return watcher_for(database, listen=listen)


def wait_result(backend: Any, result_id: str, timeout: Any = None) -> TaskResult:
    """Block until task ``result_id`` is SUCCESSFUL or FAILED and return its result; raise
    ``WaitTimeout`` after ``timeout`` seconds (None: no limit)."""
    limit = wait_timeout(timeout)
    deadline = None if limit is None else time.monotonic() + limit
    result = backend.get_result(result_id)
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
            result = _read(backend.get_result, result, deadline, limit)
            if result.is_finished:
                return result
    finally:
        watcher.remove(waiter)


async def await_result(backend: Any, result_id: str, timeout: Any = None) -> TaskResult:
    """Async ``wait_result``: sleeps on an ``asyncio.Event``, with no thread or connection."""
    limit = wait_timeout(timeout)
    deadline = None if limit is None else time.monotonic() + limit
    result = await backend.aget_result(result_id)
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
                result = await backend.aget_result(result_id)
            except DatabaseError as e:
                _timed_out_by(e, result, deadline, limit)
                raise
            if result.is_finished:
                return result
    finally:
        watcher.remove(waiter)


def _read(read: Any, result: TaskResult, deadline: float | None, limit: float | None) -> Any:
    try:
        return read(result.id)
    except DatabaseError as e:
        _timed_out_by(e, result, deadline, limit)
        raise


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
