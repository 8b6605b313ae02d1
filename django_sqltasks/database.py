"""Database calls that ride out transient faults: dropped connections, restarts, lock timeouts."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connections

logger = logging.getLogger("django_sqltasks")

T = TypeVar("T")

FIRST_BACKOFF = 0.05  # seconds before the first retry
MAX_BACKOFF = 5.0  # seconds; retries continue at this pace until the database is back
RETRIES_WHEN_STOPPING = 3  # once the worker stops, give up after this many retries


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` may go away by itself: lost connection, restart, lock or deadlock."""
    if isinstance(error, (OperationalError, InterfaceError)):
        return True
    cause = error.__cause__
    # psycopg reports a server shutdown during a statement as a DatabaseError subclass.
    name = type(cause).__name__ if cause is not None else ""
    return name in {
        "AdminShutdown",
        "OperationalError",
        "InterfaceError",
        "SerializationFailure",
        "DeadlockDetected",
        "QueryCanceled",
    }


def run_with_retries(alias: str, fn: Callable[[], T], stopping: threading.Event | None = None) -> T:
    """Call ``fn`` (which uses ``connections[alias]``); on a transient error reconnect and retry."""
    attempt = 0
    while True:
        try:
            return fn()
        except DatabaseError as e:
            if not is_transient(e):
                raise
            attempt += 1
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
            _reset(alias)
            threading.Event().wait(delay)


def _reset(alias: str) -> None:
    """Drop the connection so the next call opens a fresh one."""
    connection = connections[alias]
    try:
        if connection.in_atomic_block:
            connection.needs_rollback = True
        else:
            connection.close()
    except Exception:  # the connection is broken already; forgetting it is all that is left
        connection.connection = None
