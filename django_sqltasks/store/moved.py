"""Statements that may meet a task as it moves between partitions (PostgreSQL).

On the partitioned task table a task's row moves when its status crosses between live and
finished (a finish, a retry, a cancel). A statement that waited for that row's lock then fails
with SQLSTATE 40001, "tuple to be locked was already moved to another partition due to
concurrent update", instead of following the row as it would within one table. Run again, it
reads the row where it is now, and its conditions decide afresh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.db import OperationalError, connections

from ..sql.errors import driver_error

T = TypeVar("T")

TRIES = 5  # each retry follows one more move of the row: more than a few in a row is a bug
MOVED_SQLSTATE = "40001"  # serialization_failure, as PostgreSQL raises it for a moved row


def was_moved(error: BaseException) -> bool:
    """Whether ``error`` says a row had moved to another partition (or, at a stricter
    isolation level than Django's, any serialization failure: a rerun is right for both)."""
    return getattr(driver_error(error), "sqlstate", None) == MOVED_SQLSTATE


def rerun_if_moved(using: str, fn: Callable[[], T]) -> T:
    """Call ``fn`` (its own transaction, or autocommit statements on ``using``) again while it
    fails on a row that moved partition. Inside a caller's transaction, raise at once: the
    transaction is broken and only its owner can start it again."""
    for attempt in range(1, TRIES + 1):
        try:
            return fn()
        except OperationalError as e:
            if not was_moved(e) or attempt == TRIES or connections[using].in_atomic_block:
                raise
    raise AssertionError("unreachable")
