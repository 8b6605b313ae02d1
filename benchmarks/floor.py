"""The bare-SQL floor of enqueue-to-start latency: a minimal table, psycopg, LISTEN/NOTIFY.

The enqueue is one autocommit statement that inserts the row and notifies (one round trip, one
commit). The worker LISTENs on one connection; woken by a notification, it claims the oldest
ready row with one statement (``UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED)
RETURNING``, which commits), runs it, and marks it done with one more. Nothing else: no Django,
no retries, results, leases or recovery. It is what no PostgreSQL task queue can beat on the
machine, so each system's latency stands beside it, measured in the same run with the same
probe (``benchmarks.agent latency``). PostgreSQL only: SQLite has no notification between
processes, so a floor there would be whatever poll interval one picked.
Usage: ``python -m benchmarks.floor worker``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

import psycopg

from benchmarks.marker import send_probe
from benchmarks.rawsql import conninfo
from benchmarks.services import create_database
from benchmarks.systems.base import Endpoints

DATABASE_NAME = "bench_sql_floor"
CHANNEL = "floor_task"
# A notification cannot be lost while the connection lives: the worker claims once before it
# waits, and notifications that arrive meanwhile wait on the connection. The timeout only
# bounds a wait whose notification never comes (a dead connection raises instead).
WAIT_SECONDS = 60.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS floor_task (
    id bigserial PRIMARY KEY,
    task text NOT NULL,
    args jsonb NOT NULL,
    state smallint NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS floor_task_ready ON floor_task (id) WHERE state = 0;
"""

ENQUEUE = (
    "WITH i AS (INSERT INTO floor_task (task, args) VALUES (%s, %s) RETURNING id) "
    f"SELECT pg_notify('{CHANNEL}', '') FROM i"
)
CLAIM = (
    "UPDATE floor_task SET state = 1 WHERE id = (SELECT id FROM floor_task WHERE state = 0 "
    "ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, task, args"
)
DONE = "UPDATE floor_task SET state = 2 WHERE id = %s"


def create_schema(
    endpoints: Endpoints, database: str = DATABASE_NAME, schema: str = SCHEMA
) -> None:
    create_database(endpoints, "postgresql", database)
    with psycopg.connect(**conninfo(endpoints, database), autocommit=True) as conn:
        conn.execute(schema)


def truncate(
    endpoints: Endpoints, database: str = DATABASE_NAME, tables: str = "floor_task"
) -> None:
    with psycopg.connect(**conninfo(endpoints, database), autocommit=True) as conn:
        conn.execute(f"TRUNCATE {tables} RESTART IDENTITY")


_enqueue_conns: dict[str, psycopg.AsyncConnection[Any]] = {}


async def enqueue_one(
    task: str, args: list[Any], database: str = DATABASE_NAME, statement: str = ENQUEUE
) -> None:
    """Insert one task and notify the worker, in one statement on a connection kept open."""
    if (conn := _enqueue_conns.get(database)) is None:
        conn = _enqueue_conns[database] = await psycopg.AsyncConnection.connect(
            **conninfo(Endpoints.from_env(), database), autocommit=True
        )
    await conn.execute(statement, (task, json.dumps(args)))


def run_task(task: str, args: list[Any]) -> None:
    if task == "probe":
        send_probe(int(args[2]), int(args[0]), float(args[1]))
    elif task != "noop":
        raise ValueError(f"the floor worker runs probe and noop tasks, not {task!r}")


def work() -> None:
    """Claim and run tasks one at a time; wait for a notification when there are none."""
    with psycopg.connect(**conninfo(Endpoints.from_env(), DATABASE_NAME), autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        while True:
            row = conn.execute(CLAIM).fetchone()
            if row is None:
                for _ in conn.notifies(timeout=WAIT_SECONDS, stop_after=1):
                    pass
                continue
            task_id, task, args = row
            run_task(task, args)
            conn.execute(DONE, (task_id,))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.floor")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("worker")
    parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        work()
    return 0


if __name__ == "__main__":
    sys.exit(main())
