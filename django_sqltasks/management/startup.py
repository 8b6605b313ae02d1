"""Reaching the database when a worker starts: one clear line, and an optional wait for it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import InterfaceError, OperationalError, connections

from ..core.backends import sql_backends
from ..sql.installation import is_missing_table, unreachable

logger = logging.getLogger("django_sqltasks")

FIRST_WAIT = 0.5  # seconds before the second try
MAX_WAIT = 5.0  # seconds; the pause between tries doubles up to this


class OneLineWhenUnreachable(BaseCommand):
    """A command that, when a database cannot be reached, says so in one line (as the worker
    does) instead of a traceback: from its own queries, or from Django's system checks, which
    connect on MySQL."""

    def execute(self, *args: Any, **options: Any) -> str | None:
        try:
            return super().execute(*args, **options)
        except (OperationalError, InterfaceError) as e:  # a refused or lost connection
            if is_missing_table(e):
                raise
            raise CommandError(_which_unreachable(e)) from e


def _which_unreachable(error: BaseException) -> str:
    """``describe`` of the first database that cannot be reached, those holding tasks first."""
    holding_tasks = sorted({backend.database for backend in sql_backends().values()})
    for alias in [*holding_tasks, *(a for a in connections if a not in holding_tasks)]:
        try:
            connections[alias].ensure_connection()
        except (OperationalError, InterfaceError) as e:
            return describe(alias, e)
    return "Cannot connect to the database: " + " ".join(str(error).split())


class DatabaseUnreachable(Exception):
    """The database could not be reached, for as long as the worker was told to wait."""


def describe(alias: str, error: BaseException) -> str:
    """Say in one line which database could not be reached, where, and why."""
    return unreachable(alias, error)


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
