"""Reaching the database when a worker starts: one clear line, and an optional wait for it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.db import InterfaceError, OperationalError, connections

from ..sql import dialect_for

logger = logging.getLogger("django_sqltasks")

FIRST_WAIT = 0.5  # seconds before the second try
MAX_WAIT = 5.0  # seconds; the pause between tries doubles up to this


class DatabaseUnreachable(Exception):
    """The database could not be reached, for as long as the worker was told to wait."""


def describe(alias: str, error: BaseException) -> str:
    """Say in one line which database could not be reached, where, and why."""
    connection = connections[alias]
    where = dialect_for(connection).location()
    reason = " ".join(str(error).split())  # drivers' messages span lines; a log line must not
    return f"Cannot connect to database {alias!r} ({connection.vendor} at {where}): {reason}"


def connect(check: Callable[[], None], alias: str, wait: float) -> None:
    """Run ``check`` (which connects to ``alias``); on a connection error retry with backoff for
    up to ``wait`` seconds, logging each failure, then raise ``DatabaseUnreachable``.

    Only connection errors are retried: a missing table or an old server version is not going
    to fix itself, and ``check`` reports those as ``RuntimeError``.
    """
    deadline = time.monotonic() + wait
    pause = FIRST_WAIT
    while True:
        try:
            check()
            return
        except (OperationalError, InterfaceError) as e:  # what a refused or lost connection raises
            message = describe(alias, e)
            left = deadline - time.monotonic()
            if left <= 0:
                raise DatabaseUnreachable(message) from e
        nap = min(pause, left)
        logger.warning(
            "%s; trying again in %.1fs (%.0fs of --wait-for-database left)",
            message,
            nap,
            left,
            extra={"action": "wait_for_database"},
        )
        time.sleep(nap)
        pause = min(pause * 2, MAX_WAIT)
