"""What the database says about the upkeep of the task table, one statement per database: the
statistics of its rows, whether it may be vacuumed, and the oldest transaction of another
session, which holds back the cleanup of old row versions (SQLite: the WAL that a read
transaction keeps from being checkpointed).
ops/health.py turns these into warnings. (What the health probe runs besides its reads:
``sql/probes.py``.)"""

from __future__ import annotations

import os
from typing import Any

from django.db import DatabaseError
from django.db.backends.utils import CursorWrapper

from .errors import driver_error
from .rows import TableHealth

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
