"""Database calls that ride out transient faults: dropped connections, restarts, lock timeouts.

The worker's own calls (its database thread, its outcome writes, its upkeep) and a durable
task's writes from its own thread (``store/steps.py``) go through this one loop."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, connections

from . import dialect_for
from .broken import drop

logger = logging.getLogger("django_sqltasks")

T = TypeVar("T")

FIRST_BACKOFF = 0.05  # seconds before the first retry
MAX_BACKOFF = 5.0  # seconds; retries continue at this pace until the database is back
RETRIES_WHEN_STOPPING = 3  # once the worker stops, give up after this many retries
QUIET_CONTENTION_RETRIES = 2  # retries of a lock conflict logged at INFO; the next at WARNING


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
    within: float | None = None,
    about: str = "",
    on_lost: Callable[[], None] | None = None,
) -> T:
    """Call ``fn`` (which uses ``connections[alias]``); on a transient error reconnect and retry,
    up to ``attempts`` calls in all, and for up to ``within`` seconds after the first error
    (None: until the database is back, or a few more once ``stopping`` is set). Any other
    error is raised at once. ``about`` says in the log what the call was for; ``on_lost`` is
    called at each transient error that is not contention (the connection was lost, or the
    server is going or coming), before the connection is dropped."""
    attempt = 0
    deadline = None
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
            if within is not None:
                deadline = deadline or time.monotonic() + within
                if time.monotonic() + delay > deadline:
                    raise
            where = f" {about}" if about else ""
            if dialect_for(connections[alias]).is_contention(e):
                # A deadlock or a lock wait another transaction caused: the database rolled
                # this try back and it runs again, nothing lost. Said so, at INFO for the first
                # tries: MySQL's "Deadlock found" in a warning reads as a fault when it is
                # routine; a conflict that goes on is a warning.
                logger.log(
                    logging.INFO if attempt <= QUIET_CONTENTION_RETRIES else logging.WARNING,
                    "Lock conflict with another transaction%s (attempt %d): this try was "
                    "rolled back, retrying in %.2fs: %s",
                    where,
                    attempt,
                    delay,
                    e,
                    extra={"action": "db_retry", "attempt": attempt, "contention": True},
                )
            else:
                logger.warning(
                    "Transient database error%s (attempt %d), retrying in %.2fs: %s",
                    where,
                    attempt,
                    delay,
                    e,
                    extra={"action": "db_retry", "attempt": attempt},
                )
                if on_lost is not None:
                    on_lost()
            reset(alias)
            threading.Event().wait(delay)


def reset(alias: str) -> None:
    """Drop the connection so the next call opens a fresh one."""
    connection = connections[alias]
    if connection.in_atomic_block:
        connection.needs_rollback = True  # the transaction's owner rolls it back
    else:
        drop(connection)
