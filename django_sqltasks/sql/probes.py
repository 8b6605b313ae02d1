"""What the health probe (``tasks_health``, ops/probe.py) runs on each database besides its
reads of the task table: each queue's oldest READY task through the claim's ready indexes, a
time limit on its statements and on their lock waits, and a write that changes nothing."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from django.db.backends.utils import CursorWrapper

from .claims import ClaimStatements
from .errors import driver_error
from .rows import UNLIMITED


class ProbeStatements(ClaimStatements):
    """What ``tasks_health`` runs: each queue's oldest READY task and the earliest due tasks
    under a limit (through the claim's ready indexes), each database's time limit on a
    statement and on its lock waits, and a write that changes nothing."""

    def _oldest_ready_sql(self, backend_name: str, queue_name: str) -> tuple[str, list[Any]]:
        """The earliest ``available_at`` of the READY tasks of no limit in one queue: the
        earliest task of each priority in ``_priorities_sql``, one probe of
        ``sqltasks_ready_idx`` each (which leads with the queue, then the priority)."""
        prefix, prefix_params = self._ready_prefix(backend_name, [queue_name], UNLIMITED)
        priorities, priority_params = self._priorities_sql(backend_name, [queue_name], UNLIMITED)
        return (
            f"""
            WITH RECURSIVE {priorities}
            SELECT MIN((
                SELECT available_at FROM {self.tasks} WHERE {prefix} AND priority = priorities.p
                ORDER BY available_at LIMIT 1
            )) FROM priorities WHERE p IS NOT NULL
            """,
            [*priority_params, *prefix_params],
        )

    def oldest_ready(
        self, cursor: CursorWrapper, backend_name: str, queue_name: str
    ) -> datetime | None:
        """When the oldest READY task of no limit in ``queue_name`` became (or becomes) due;
        None if it has none. Its cost is one index probe per priority, whatever the backlog:
        if that task is due, it is the queue's oldest due task."""
        cursor.execute(*self._oldest_ready_sql(backend_name, queue_name))
        row = cursor.fetchone()
        return None if row is None else self._decode_datetime(row[0])

    def _oldest_limited_sql(self, backend_name: str, count: int) -> tuple[str, list[Any]]:
        """The ``count`` earliest due READY tasks under a limit, through
        ``sqltasks_ready_limited_at_idx`` (backend, due time): their queue and due time."""
        now, now_params = self._now_sql()
        return (
            f"SELECT queue_name, available_at FROM {self.tasks} "
            "WHERE status = 'READY' AND limit_key IS NOT NULL AND backend_name = %s "
            f"AND available_at <= {now} ORDER BY available_at LIMIT %s",
            [backend_name, *now_params, count],
        )

    def oldest_limited(
        self, cursor: CursorWrapper, backend_name: str, count: int
    ) -> list[tuple[str, datetime]]:
        """The queue and due time of the ``count`` earliest due tasks under a limit, earliest
        first: a queue's first one is its oldest due limited task (one range of one index,
        however many wait behind them)."""
        cursor.execute(*self._oldest_limited_sql(backend_name, count))
        found = []
        for queue, at in cursor.fetchall():
            due = self._decode_datetime(at)
            if due is not None:
                found.append((queue, due))
        return found

    def limit_connect(self, seconds: float) -> None:
        """Give up connecting after about ``seconds``, if this process has not connected yet
        and the settings name no timeout of their own."""

    def save_time_limits(self, cursor: CursorWrapper) -> Any:
        """What ``restore_time_limits`` needs to undo ``limit_time`` on this connection."""
        return None

    def limit_time(self, cursor: CursorWrapper, seconds: float) -> None:
        """End each statement that follows on this connection after ``seconds``, lock waits
        included. Call it inside the probe's transaction (PostgreSQL's limit lasts until that
        transaction ends)."""

    def restore_time_limits(self, cursor: CursorWrapper, saved: Any) -> None:
        """Undo ``limit_time``, given what ``save_time_limits`` returned."""

    def write_nothing(self, cursor: CursorWrapper) -> None:
        """Run a write that changes nothing: the database's error if it takes no writes (a hot
        standby, default_transaction_read_only, a read-only file refuse it, as they would the
        workers' claims and heartbeats). It matches no row, so it locks none."""
        cursor.execute(f"UPDATE {self.workers} SET id = id WHERE 1 = 0")

    def is_read_only(self, error: BaseException) -> bool:
        """Whether ``error`` says the database takes no writes."""
        return False

    def is_timeout(self, error: BaseException) -> bool:
        """Whether ``error`` is ``limit_time``'s: a statement or a lock wait ran out of time."""
        return False

    def _connect_timeout(self, seconds: float) -> None:
        """Set the driver's ``connect_timeout`` (whole seconds, at least 2: libpq's least)."""
        connection = self._current_connection()
        options = connection.settings_dict.setdefault("OPTIONS", {})
        if connection.connection is None and "connect_timeout" not in options:
            options["connect_timeout"] = max(int(seconds + 0.999), 2)


def _sqlstate(error: BaseException) -> str | None:
    cause = driver_error(error)
    return getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)  # psycopg 3, 2


def _mysql_code(error: BaseException) -> Any:
    args: tuple[Any, ...] = getattr(driver_error(error), "args", ())
    return args[0] if args else None


# set_config(..., true) is SET LOCAL: it ends with the probe's transaction.
PG_LIMIT_SQL = (
    "SELECT set_config('statement_timeout', %s, true), set_config('lock_timeout', %s, true)"
)
PG_READ_ONLY = "25006"  # read_only_sql_transaction
PG_TIMEOUTS = frozenset({"57014", "55P03"})  # query_canceled, lock_not_available


class PostgreSQLProbe(ProbeStatements):
    def limit_connect(self, seconds: float) -> None:
        self._connect_timeout(seconds)

    def limit_time(self, cursor: CursorWrapper, seconds: float) -> None:
        limit = f"{max(int(seconds * 1000), 1)}ms"
        cursor.execute(PG_LIMIT_SQL, [limit, limit])

    def is_read_only(self, error: BaseException) -> bool:
        return _sqlstate(error) == PG_READ_ONLY

    def is_timeout(self, error: BaseException) -> bool:
        return _sqlstate(error) in PG_TIMEOUTS


# MariaDB's max_statement_time is in seconds (any statement); MySQL's max_execution_time in
# milliseconds (a SELECT only). Lock waits: metadata locks (a LOCK TABLES, an ALTER) and
# InnoDB's row locks, in whole seconds.
MARIADB_LIMITS = ("max_statement_time", "lock_wait_timeout", "innodb_lock_wait_timeout")
MYSQL_LIMITS = ("max_execution_time", "lock_wait_timeout", "innodb_lock_wait_timeout")
MYSQL_READ_ONLY = frozenset(
    {
        1792,  # ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION: a READ ONLY transaction
        1290,  # ER_OPTION_PREVENTS_STATEMENT: read_only, super_read_only
        1836,  # ER_READ_ONLY_MODE: innodb_read_only
    }
)
MYSQL_TIMEOUTS = frozenset(
    {
        1969,  # ER_STATEMENT_TIMEOUT: MariaDB's max_statement_time
        3024,  # ER_QUERY_TIMEOUT: MySQL's max_execution_time
        1205,  # ER_LOCK_WAIT_TIMEOUT: lock_wait_timeout, innodb_lock_wait_timeout
    }
)


class MySQLProbe(ProbeStatements):
    def _limits(self) -> tuple[str, ...]:
        mariadb = getattr(self.connection, "mysql_is_mariadb", False)
        return MARIADB_LIMITS if mariadb else MYSQL_LIMITS

    def limit_connect(self, seconds: float) -> None:
        self._connect_timeout(seconds)

    def save_time_limits(self, cursor: CursorWrapper) -> Any:
        cursor.execute("SELECT " + ", ".join(f"@@session.{name}" for name in self._limits()))
        return cursor.fetchone()

    def limit_time(self, cursor: CursorWrapper, seconds: float) -> None:
        names = self._limits()
        statement = seconds if names is MARIADB_LIMITS else max(int(seconds * 1000), 1)
        lock = max(int(seconds + 0.999), 1)  # whole seconds, at least one
        self._set(cursor, names, [statement, lock, lock])

    def restore_time_limits(self, cursor: CursorWrapper, saved: Any) -> None:
        if saved is not None:
            self._set(cursor, self._limits(), list(saved))

    @staticmethod
    def _set(cursor: CursorWrapper, names: tuple[str, ...], values: list[Any]) -> None:
        cursor.execute("SET " + ", ".join(f"SESSION {name} = %s" for name in names), values)

    def is_read_only(self, error: BaseException) -> bool:
        return _mysql_code(error) in MYSQL_READ_ONLY

    def is_timeout(self, error: BaseException) -> bool:
        return _mysql_code(error) in MYSQL_TIMEOUTS


# SQLite: a wait for another connection's write lock ends after the busy timeout ("database is
# locked"); a statement is interrupted by a progress handler once its time is up.
SQLITE_BUSY_TIMEOUT_SQL = "PRAGMA busy_timeout"
SQLITE_PROGRESS_STEPS = 1000  # virtual machine instructions between two looks at the clock


class SQLiteProbe(ProbeStatements):
    def save_time_limits(self, cursor: CursorWrapper) -> Any:
        cursor.execute(SQLITE_BUSY_TIMEOUT_SQL)
        return int(cursor.fetchone()[0])

    def limit_time(self, cursor: CursorWrapper, seconds: float) -> None:
        self._busy_timeout(cursor, max(int(seconds * 1000), 1))
        deadline = time.monotonic() + seconds
        raw = self._current_connection().connection
        raw.set_progress_handler(lambda: time.monotonic() > deadline, SQLITE_PROGRESS_STEPS)

    def restore_time_limits(self, cursor: CursorWrapper, saved: Any) -> None:
        self._current_connection().connection.set_progress_handler(None, SQLITE_PROGRESS_STEPS)
        if saved is not None:
            self._busy_timeout(cursor, int(saved))

    @staticmethod
    def _busy_timeout(cursor: CursorWrapper, busy_ms: int) -> None:
        cursor.execute(f"PRAGMA busy_timeout = {busy_ms:d}")  # an int: a PRAGMA takes no parameter

    def is_read_only(self, error: BaseException) -> bool:
        return "readonly database" in str(error)

    def is_timeout(self, error: BaseException) -> bool:
        message = str(error)
        return (
            "database is locked" in message
            or "table is locked" in message
            or message == "interrupted"
        )
