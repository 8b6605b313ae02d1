"""The "raw SQL limit": a task table driven by plain psycopg, with no task framework.

Enqueue inserts rows in batches of up to ``in_flight``; the worker claims up to its free
concurrency in one statement (CTE ... FOR UPDATE SKIP LOCKED, UPDATE ... RETURNING), runs the
tasks on one asyncio loop, and marks finished ones in one batched UPDATE. Its only purpose is to
show what PostgreSQL itself allows on this machine; it has no retries, results API or recovery.
Usage: ``python -m benchmarks.rawsql worker --concurrency 200``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from typing import Any

import psycopg

from benchmarks.marker import CompletionCounter, send_probe
from benchmarks.systems.base import Endpoints, postgres_name

DATABASE_NAME = "bench_raw_sql"  # with the run's suffix: postgres_name
IDLE_POLL = 0.010  # seconds between claims when the queue is empty
SLEEP_SECONDS = 0.010

SCHEMA = """
CREATE TABLE IF NOT EXISTS raw_task (
    id bigserial PRIMARY KEY,
    queue text NOT NULL DEFAULT 'default',
    task text NOT NULL,
    args jsonb NOT NULL DEFAULT '[]',
    status smallint NOT NULL DEFAULT 0,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz
);
CREATE INDEX IF NOT EXISTS raw_task_ready ON raw_task (queue, id) WHERE status = 0;
"""

INSERT_BATCH = "INSERT INTO raw_task (task, args) SELECT %s, a FROM unnest(%s::jsonb[]) AS a"

CLAIM = """
WITH ready AS (
    SELECT id FROM raw_task WHERE queue = 'default' AND status = 0
    ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
)
UPDATE raw_task t SET status = 1, started_at = now()
FROM ready WHERE t.id = ready.id
RETURNING t.id, t.task, t.args
"""

COMPLETE = "UPDATE raw_task SET status = 2, finished_at = now() WHERE id = ANY(%s)"


def server_conninfo(endpoints: Endpoints) -> dict[str, Any]:
    """The server's own database, ``postgres``: to create and drop the benchmark's."""
    return {
        "host": endpoints.host("postgresql"),
        "port": endpoints.port("postgresql"),
        "user": os.environ.get("BENCH_PG_USER", "postgres"),
        "password": os.environ.get("BENCH_PG_PASSWORD", ""),
        "dbname": "postgres",
    }


def conninfo(endpoints: Endpoints, dbname: str = DATABASE_NAME) -> dict[str, Any]:
    """Benchmark database ``dbname`` (with the run's suffix, see ``postgres_name``)."""
    return server_conninfo(endpoints) | {"dbname": postgres_name(dbname)}


def create_schema(endpoints: Endpoints) -> None:
    from benchmarks.services import create_database

    create_database(endpoints, "postgresql", DATABASE_NAME)
    with psycopg.connect(**conninfo(endpoints), autocommit=True) as conn:
        conn.execute(SCHEMA)


def truncate(endpoints: Endpoints) -> None:
    with psycopg.connect(**conninfo(endpoints), autocommit=True) as conn:
        conn.execute("TRUNCATE raw_task RESTART IDENTITY")


async def enqueue_batches(task: str, n: int, batch: int) -> float:
    """Insert ``n`` rows in batches of ``batch``; return the seconds taken after connecting."""
    async with await psycopg.AsyncConnection.connect(
        **conninfo(Endpoints.from_env()), autocommit=True
    ) as conn:
        started = time.perf_counter()
        for offset in range(0, n, batch):
            size = min(batch, n - offset)
            await conn.execute(INSERT_BATCH, (task, ["[]"] * size))
        return time.perf_counter() - started


_probe_conn: psycopg.AsyncConnection[Any] | None = None


async def enqueue_one(task: str, args: list[Any]) -> None:
    global _probe_conn
    if _probe_conn is None:
        _probe_conn = await psycopg.AsyncConnection.connect(
            **conninfo(Endpoints.from_env()), autocommit=True
        )
    await _probe_conn.execute(INSERT_BATCH, (task, [json.dumps(args)]))


async def _run(task: str, args: list[Any]) -> None:
    if task == "sleep":
        await asyncio.sleep(SLEEP_SECONDS)
    elif task == "probe":
        send_probe(int(args[2]), int(args[0]), float(args[1]))


async def work(concurrency: int, counter: CompletionCounter | None) -> None:
    async with await psycopg.AsyncConnection.connect(
        **conninfo(Endpoints.from_env()), autocommit=True
    ) as conn:
        running: dict[asyncio.Task[None], int] = {}
        while True:
            free = concurrency - len(running)
            rows = (await (await conn.execute(CLAIM, (free,))).fetchall()) if free else []
            for task_id, name, args in rows:
                running[asyncio.create_task(_run(name, args))] = task_id
            if not running:
                await asyncio.sleep(IDLE_POLL)
                continue
            done, _ = await asyncio.wait(
                running, timeout=IDLE_POLL, return_when=asyncio.FIRST_COMPLETED
            )
            if done:
                await conn.execute(COMPLETE, ([running.pop(t) for t in done],))
                if counter:
                    for _ in done:
                        counter.hit()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rawsql")
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker")
    worker.add_argument("--concurrency", type=int, default=200)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(work(args.concurrency, CompletionCounter.from_env()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
