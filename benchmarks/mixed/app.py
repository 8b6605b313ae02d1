"""The app's side of the database: its table, the one write each task makes, the task's report.

Every task, on either system, updates one row of ``app_account`` (what a real task's small write
looks like) and then tells the harness, in one UDP datagram, when it was enqueued, when its body
started and when it ended. The analytics sessions count the same table.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

TABLE = "app_account"
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    id integer PRIMARY KEY,
    balance bigint NOT NULL DEFAULT 0,
    updated_at timestamptz,
    note text NOT NULL
);
"""
FILL = f"""
INSERT INTO {TABLE} (id, note)
SELECT i, md5(i::text) || md5((i + 1)::text) FROM generate_series(1, %s) AS i
"""
# CURRENT_TIMESTAMP: PostgreSQL's now(), and what MariaDB and SQLite (no now()) read too.
WRITE = f"UPDATE {TABLE} SET balance = balance + 1, updated_at = CURRENT_TIMESTAMP WHERE id = %s"
ANALYTICS_READ = f"SELECT count(*) FROM {TABLE}"

# One datagram per task: seq, enqueued at, body started at, body ended at (epoch seconds).
TASK_EVENT = struct.Struct("!qddd")
# The enqueuer's progress, every PROGRESS_EVERY seconds: tasks enqueued, when, the slowest call.
PROGRESS_EVENT = struct.Struct("!qdd")
PROGRESS_EVERY = 0.5  # seconds
# A statement a worker or the enqueuer ran (benchmarks/mixed/timing.py): its kind's index in
# the harness's list, its seconds.
STATEMENT_EVENT = struct.Struct("!Bd")

_socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


def create(cursor: Any, accounts: int) -> None:
    """Create the app's table with ``accounts`` rows (a connection in autocommit)."""
    cursor.execute(SCHEMA)
    cursor.execute(f"TRUNCATE {TABLE}")
    cursor.execute(FILL, (accounts,))
    cursor.execute(f"VACUUM ANALYZE {TABLE}")


def server_bound(cursor: Any) -> Any:
    """On psycopg 3, a cursor of ``cursor``'s connection that binds its values on the server,
    as the classic worker's own psycopg cursor does (Django's binds them in the client, so each
    write's text differs and is planned at every call, a cost of the harness's making that the
    classic side would not pay): the write is then the same statement on both systems,
    prepared where the connection prepares (psycopg's default on the classic side, OPTIONS
    ``prepare_threshold`` on django-sqltasks'). None elsewhere: the cursor as it is."""
    try:
        import psycopg
    except ImportError:
        return None
    if not isinstance(getattr(cursor, "connection", None), psycopg.Connection):
        return None
    return psycopg.Cursor(cursor.connection)


def run_task(cursor: Any, seq: int, enqueued_at: float, port: int, account: int) -> None:
    """The task's body on either system: one small write, then the report to the harness."""
    started = time.time()
    cursor.execute(WRITE, (account,))
    ended = time.time()
    _socket.sendto(TASK_EVENT.pack(seq, enqueued_at, started, ended), ("127.0.0.1", port))
