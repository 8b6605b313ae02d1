"""Database calls that ride out transient faults: dropped connections, restarts, lock timeouts."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from django.db import DatabaseError, connections

from ..sql import dialect_for
from ..sql.broken import drop

logger = logging.getLogger("django_sqltasks")

T = TypeVar("T")

FIRST_BACKOFF = 0.05  # seconds before the first retry
MAX_BACKOFF = 5.0  # seconds; retries continue at this pace until the database is back
RETRIES_WHEN_STOPPING = 3  # once the worker stops, give up after this many retries


def is_transient(alias: str, error: BaseException) -> bool:
    """Whether ``error``, raised on ``connections[alias]``, may go away by itself: a lost
    connection, a restart, a deadlock, a lock timeout (each database's list is in ``sql/``)."""
    return isinstance(error, DatabaseError) and dialect_for(connections[alias]).is_transient(error)


def run_with_retries(
    alias: str,
    fn: Callable[[], T],
    stopping: threading.Event | None = None,
    *,
    attempts: int | None = None,
) -> T:
    """Call ``fn`` (which uses ``connections[alias]``); on a transient error reconnect and retry,
    up to ``attempts`` calls in all (None: until the database is back, or a few more once
    ``stopping`` is set). Any other error is raised at once."""
    attempt = 0
    while True:
        try:
            return fn()
        except DatabaseError as e:
            if not is_transient(alias, e):
                raise
            attempt += 1
            if attempts is not None and attempt >= attempts:
                raise
            if stopping is not None and stopping.is_set() and attempt > RETRIES_WHEN_STOPPING:
                raise
            delay = min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** (attempt - 1))
            delay *= 0.5 + random.random() / 2  # jitter, so workers do not retry in step
            logger.warning(
                "Transient database error (attempt %d), retrying in %.2fs: %s",
                attempt,
                delay,
                e,
                extra={"action": "db_retry", "attempt": attempt},
            )
            reset(alias)
            threading.Event().wait(delay)


def reset(alias: str) -> None:
    """Drop the connection so the next call opens a fresh one."""
    connection = connections[alias]
    if connection.in_atomic_block:
        connection.needs_rollback = True  # the transaction's owner rolls it back
    else:
        drop(connection)


class DatabaseThread:
    """A worker's database thread: one connection for its claims, its lease and its upkeep.
    Set up once, here; any thread may call it."""

    def __init__(self, database: str, stopping: threading.Event) -> None:
        self.database = database
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="sqltasks-db")
        self._stopping = stopping  # set when the worker winds down: retries give up sooner

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the thread, riding out transient errors (from the loop)."""
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, run_with_retries, self.database, partial(fn, *args), self._stopping
        )
