"""What the database says about the upkeep of the task table, one statement per database that
says anything (SQLite does not): the statistics of its rows, whether it may be vacuumed, and
the oldest transaction of another session, which holds back the cleanup of old row versions.
ops/health.py turns these into warnings."""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError
from django.db.backends.utils import CursorWrapper

from .rows import TableHealth
from .vendor import driver_error

# PostgreSQL ----------------------------------------------------------------------------------

# The task table's autovacuum and row statistics, and the oldest transaction of another session
# of this database that holds a snapshot or an xid: what keeps vacuum from removing dead rows
# (other databases' sessions do not hold back this table's cleanup). %s: the table's live
# partition (where the claims and outcomes leave their dead rows) when it is partitioned, then
# the table's name.
TABLE_HEALTH_SQL = """
SELECT current_setting('autovacuum')::boolean,
    (SELECT o.option_value::boolean FROM pg_options_to_table(c.reloptions) AS o
     WHERE o.option_name = 'autovacuum_enabled'),
    s.n_live_tup, s.n_dead_tup,
    a.pid, EXTRACT(EPOCH FROM clock_timestamp() - a.xact_start)::float8, a.state,
    a.application_name
FROM (SELECT COALESCE(to_regclass(%s), to_regclass(%s)) AS oid) AS r
LEFT JOIN pg_class AS c ON c.oid = r.oid
LEFT JOIN pg_stat_user_tables AS s ON s.relid = r.oid
LEFT JOIN LATERAL (
    SELECT pid, xact_start, state, application_name FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
        AND backend_type = 'client backend' AND xact_start IS NOT NULL
        AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
    ORDER BY xact_start LIMIT 1
) AS a ON true
"""


def read_postgresql(cursor: CursorWrapper, table: str) -> TableHealth:
    """The task table's (``table``, its quoted name) autovacuum, live and dead rows, and the
    oldest transaction that holds back its cleanup."""
    # Statistics are read once per transaction and cached: read them afresh.
    cursor.execute("SELECT pg_stat_clear_snapshot()")
    live = table[:-1] + '_live"' if table.endswith('"') else f"{table}_live"
    cursor.execute(TABLE_HEALTH_SQL, [live, table])
    server_on, table_on, live, dead, pid, seconds, state, application = cursor.fetchone()
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
        oldest_transaction_seconds=seconds,
        oldest_transaction_pid=pid,
        oldest_transaction_state=state,
        oldest_transaction_application=application or None,
    )


# MySQL and MariaDB ---------------------------------------------------------------------------

# The oldest transaction of another connection: its read view keeps InnoDB from purging old
# row versions, of every table. trx_started is in the server's system time zone. Needs the
# PROCESS privilege.
OLDEST_TRANSACTION_SQL = """
SELECT trx_mysql_thread_id, trx_state,
    TIMESTAMPDIFF(MICROSECOND, trx_started, CONVERT_TZ(NOW(6), @@session.time_zone, 'SYSTEM'))
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
        cursor.execute(OLDEST_TRANSACTION_SQL)
        oldest = cursor.fetchone()
        cursor.execute(HISTORY_LENGTH_SQL)
        history = cursor.fetchone()
    except DatabaseError as e:
        args: tuple[Any, ...] = getattr(driver_error(e), "args", ())
        if args and args[0] in PRIVILEGE_CODES:
            return TableHealth()  # without PROCESS, nothing to say
        raise
    pid, state, micros = oldest or (None, None, None)
    return TableHealth(
        oldest_transaction_seconds=None if micros is None else max(micros, 0) / 1e6,
        oldest_transaction_pid=pid,
        oldest_transaction_state=state,
        history_length=None if history is None else int(history[0]),
    )
