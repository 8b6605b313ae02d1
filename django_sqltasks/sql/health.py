"""What the database says about the upkeep of the task table, one statement per database: the
statistics of its rows, whether it may be vacuumed, and the oldest transaction of another
session, which holds back the cleanup of old row versions (SQLite: the WAL that a read
transaction keeps from being checkpointed).
ops/health.py turns these into warnings. And what the health probe (ops/probe.py) runs on each
database besides its reads: a time limit on its statements, and a write that changes nothing."""

from __future__ import annotations

import os
import time
from datetime import datetime
from typing import Any

from django.db import DatabaseError
from django.db.backends.utils import CursorWrapper

from .claims import ClaimStatements
from .rows import UNLIMITED, TableHealth
from .vendor import driver_error

# PostgreSQL ----------------------------------------------------------------------------------

# The task table's autovacuum and row statistics, and what holds back the horizon of this
# database (the oldest transaction whose rows vacuum must keep): the oldest snapshot or xid of
# another session (other databases' sessions do not hold back this table's cleanup), the
# oldest prepared transaction, and the replication slot with the oldest xmin. Each is read
# from a view of the server's shared memory (one row per connection, per prepared
# transaction, per slot: bounded by max_connections, max_prepared_transactions and
# max_replication_slots), never from the task table. %s: the table's live partition (where
# the claims and outcomes leave their dead rows) when it is partitioned, then the table's name.
TABLE_HEALTH_SQL = """
SELECT current_setting('autovacuum')::boolean,
    (SELECT o.option_value::boolean FROM pg_options_to_table(c.reloptions) AS o
     WHERE o.option_name = 'autovacuum_enabled'),
    s.n_live_tup, s.n_dead_tup,
    EXTRACT(EPOCH FROM clock_timestamp() - COALESCE(
        GREATEST(s.last_autovacuum, s.last_vacuum), pg_postmaster_start_time()))::float8,
    COALESCE((SELECT o.option_value::float8 FROM pg_options_to_table(c.reloptions) AS o
              WHERE o.option_name = 'autovacuum_vacuum_threshold'),
             current_setting('autovacuum_vacuum_threshold')::float8)
    + COALESCE((SELECT o.option_value::float8 FROM pg_options_to_table(c.reloptions) AS o
                WHERE o.option_name = 'autovacuum_vacuum_scale_factor'),
               current_setting('autovacuum_vacuum_scale_factor')::float8)
      * GREATEST(c.reltuples, 0),
    EXTRACT(EPOCH FROM current_setting('autovacuum_naptime')::interval)::float8,
    a.pid, EXTRACT(EPOCH FROM clock_timestamp() - a.xact_start)::float8, a.state,
    a.application_name, left(a.query, %s), a.xids,
    p.gid, EXTRACT(EPOCH FROM clock_timestamp() - p.prepared)::float8, p.owner::text,
    age(p.transaction), r.slot_name::text, age(r.xmin)
FROM (SELECT COALESCE(to_regclass(%s), to_regclass(%s)) AS oid) AS t
LEFT JOIN pg_class AS c ON c.oid = t.oid
LEFT JOIN pg_stat_user_tables AS s ON s.relid = t.oid
LEFT JOIN LATERAL (
    SELECT pid, xact_start, state, application_name, query,
        GREATEST(age(backend_xmin), age(backend_xid)) AS xids
    FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
        AND backend_type = 'client backend' AND xact_start IS NOT NULL
        AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
    ORDER BY xids DESC, xact_start LIMIT 1
) AS a ON true
LEFT JOIN LATERAL (
    SELECT gid, prepared, owner, transaction FROM pg_prepared_xacts
    WHERE database = current_database() ORDER BY age(transaction) DESC LIMIT 1
) AS p ON true
LEFT JOIN LATERAL (
    SELECT slot_name, xmin FROM pg_replication_slots
    WHERE xmin IS NOT NULL ORDER BY age(xmin) DESC LIMIT 1
) AS r ON true
"""
QUERY_START_CHARACTERS = 200  # of a session's statement: enough to tell a report from a shell


def one_line(text: str | None) -> str | None:
    """``text`` with its runs of white space made single spaces (a statement over lines)."""
    return None if text is None else " ".join(text.split()) or None


def read_postgresql(cursor: CursorWrapper, table: str) -> TableHealth:
    """The task table's (``table``, its quoted name) autovacuum, live and dead rows, and the
    oldest transaction that holds back its cleanup."""
    # Statistics are read once per transaction and cached: read them afresh.
    cursor.execute("SELECT pg_stat_clear_snapshot()")
    live = table[:-1] + '_live"' if table.endswith('"') else f"{table}_live"
    cursor.execute(TABLE_HEALTH_SQL, [QUERY_START_CHARACTERS, live, table])
    (
        server_on,
        table_on,
        live,
        dead,
        vacuumed,
        trigger,
        naptime,
        pid,
        seconds,
        state,
        application,
        query,
        xids,
        gid,
        prepared_seconds,
        prepared_owner,
        prepared_xids,
        slot,
        slot_xids,
    ) = cursor.fetchone()
    off_by = (("autovacuum",) if not server_on else ()) + (
        ("autovacuum_enabled",) if table_on is False else ()
    )
    # pg_stat_user_tables has a row for every table, so no row means no table (not migrated
    # yet): its autovacuum and rows are not known, and nothing warns of them.
    exists = live is not None
    return TableHealth(
        autovacuum=not off_by if exists else None,
        autovacuum_off_by=off_by if exists else (),
        live_rows=live,
        dead_rows=dead,
        vacuumed_seconds_ago=vacuumed if exists else None,
        autovacuum_trigger=trigger if exists else None,
        autovacuum_naptime=naptime,
        oldest_transaction_seconds=seconds,
        oldest_transaction_pid=pid,
        oldest_transaction_state=state,
        oldest_transaction_application=application or None,
        oldest_transaction_query=one_line(query),
        oldest_transaction_xids=xids,
        prepared_gid=gid,
        prepared_seconds=prepared_seconds,
        prepared_owner=prepared_owner,
        prepared_xids=prepared_xids,
        slot_name=slot,
        slot_xids=slot_xids,
    )


# MySQL and MariaDB ---------------------------------------------------------------------------

# The oldest transaction of another connection: its read view keeps InnoDB from purging old
# row versions, of every table. trx_started is in the server's system time zone. Needs the
# PROCESS privilege.
OLDEST_TRANSACTION_SQL = """
SELECT trx_mysql_thread_id, trx_state,
    TIMESTAMPDIFF(MICROSECOND, trx_started, CONVERT_TZ(NOW(6), @@session.time_zone, 'SYSTEM')),
    LEFT(trx_query, %s)
FROM information_schema.innodb_trx
WHERE trx_mysql_thread_id <> CONNECTION_ID()
ORDER BY trx_started LIMIT 1
"""
# Undo records not yet purged (MariaDB and MySQL both count them here).
HISTORY_LENGTH_SQL = (
    "SELECT count FROM information_schema.innodb_metrics WHERE name = 'trx_rseg_history_len'"
)
PRIVILEGE_CODES = frozenset({1227, 1142})  # ER_SPECIFIC_ACCESS_DENIED, ER_TABLEACCESS_DENIED


def read_mysql(cursor: CursorWrapper) -> TableHealth:
    """The oldest transaction of another connection and the undo records not yet purged;
    nothing without the PROCESS privilege."""
    try:
        cursor.execute(OLDEST_TRANSACTION_SQL, [QUERY_START_CHARACTERS])
        oldest = cursor.fetchone()
        cursor.execute(HISTORY_LENGTH_SQL)
        history = cursor.fetchone()
    except DatabaseError as e:
        args: tuple[Any, ...] = getattr(driver_error(e), "args", ())
        if args and args[0] in PRIVILEGE_CODES:
            return TableHealth()  # without PROCESS, nothing to say
        raise
    pid, state, micros, query = oldest or (None, None, None, None)
    return TableHealth(
        oldest_transaction_seconds=None if micros is None else max(micros, 0) / 1e6,
        oldest_transaction_pid=pid,
        oldest_transaction_state=state,
        oldest_transaction_query=one_line(query),
        history_length=None if history is None else int(history[0]),
    )


# SQLite ------------------------------------------------------------------------------------

# In WAL mode a checkpoint copies the WAL's frames into the database, up to the oldest read
# transaction's snapshot, and once it has copied them all the next writer starts the WAL again
# from its start. A read transaction left open in another connection stops both: the WAL grows
# by every page written while it lasts (SQLite does not say which connection holds it). A
# passive checkpoint waits for no reader or writer (it is what every commit runs past
# wal_autocheckpoint): its row is (busy, the WAL's frames, the frames checkpointed), or
# (0, -1, -1) outside WAL mode.
WAL_CHECKPOINT_SQL = "PRAGMA wal_checkpoint(PASSIVE)"
SQLITE_FILE_SQL = "PRAGMA database_list"


def read_sqlite(cursor: CursorWrapper) -> TableHealth:
    """The WAL's size and the frames a read transaction keeps from being checkpointed, after a
    passive checkpoint; nothing outside WAL mode or while another checkpoint runs."""
    cursor.execute(WAL_CHECKPOINT_SQL)
    busy, frames, checkpointed = cursor.fetchone()
    if busy or frames < 0:
        return TableHealth()
    cursor.execute("PRAGMA page_size")
    (page,) = cursor.fetchone()
    cursor.execute("PRAGMA wal_autocheckpoint")
    (automatic,) = cursor.fetchone()
    cursor.execute(SQLITE_FILE_SQL)
    path = next((row[2] for row in cursor.fetchall() if row[1] == "main"), "")
    try:
        size: int | None = os.path.getsize(f"{path}-wal") if path else None
    except OSError:
        size = None
    return TableHealth(
        wal_bytes=size,
        wal_frames=int(frames),
        wal_held_frames=int(frames) - int(checkpointed),
        wal_page_bytes=int(page),
        wal_autocheckpoint=int(automatic),
    )


# The health probe's bounds: a time limit on its statements, and a write that changes nothing


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
