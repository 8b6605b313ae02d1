"""PostgreSQL's prepared statements: the statements every task costs (its enqueue, a claim, an
outcome batch), planned once per connection where the project allows it."""

from __future__ import annotations

import threading
import weakref
from typing import Any

from django.db.backends.utils import CursorWrapper

from .vendor import Vendor

# Whether the current thread runs only the worker's own statements (``worker_thread``).
_worker = threading.local()
# The psycopg connections whose session has run ``Dialect.worker_session_statements``.
_set_up: weakref.WeakSet[Any] = weakref.WeakSet()


def worker_thread() -> None:
    """Mark the calling thread as one of the worker's own (its database thread, its outcome
    writer: a ``ThreadPoolExecutor`` initializer), which runs no task's code: the
    connections it prepares statements on get the worker's session settings
    (``Dialect.worker_session_statements``) before their first prepared statement."""
    _worker.own = True


class PreparedStatements(Vendor):
    """Running a statement as a prepared one, on psycopg 3, where the project allows it."""

    def _run_prepared(
        self, cursor: CursorWrapper, sql: str, params: list[Any], fetch: bool = True
    ) -> list[Any]:
        """Run one of the statements every task costs (its enqueue, a claim, an outcome
        batch) and read its rows (none unless ``fetch``): as a prepared statement where the
        project allows them, planned once per connection instead of at each call (planning a
        statement over the partitioned table costs about as much as running it). Django's
        cursors bind parameters on the client, and are never prepared."""
        raw: Any = getattr(cursor.cursor, "connection", None)
        if not _can_prepare(raw):
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if fetch else []
        import psycopg  # optional dependency (postgres extra)

        with self.connection.wrap_database_errors, psycopg.Cursor(raw) as prepared:
            if raw not in _set_up and getattr(_worker, "own", False) and raw.autocommit:
                # Outside a transaction, so that no rollback undoes it.
                for setting, values in self.worker_session_statements():
                    prepared.execute(setting, values)
                _set_up.add(raw)
            prepared.execute(sql, params, prepare=True)
            return prepared.fetchall() if fetch else []


def _can_prepare(raw: Any) -> bool:
    """Whether ``raw`` is a psycopg 3 connection that may hold prepared statements: only when
    the project turned them on (``OPTIONS["prepare_threshold"]`` a number; Django's default,
    None, leaves them off so that poolers in transaction mode keep working)."""
    try:
        import psycopg  # optional dependency (postgres extra)
    except ImportError:  # psycopg2
        return False
    return isinstance(raw, psycopg.Connection) and raw.prepare_threshold is not None
