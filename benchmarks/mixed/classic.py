"""The classic design beside django-sqltasks: one plain table, a partial index on its ready rows,
a claim of up to 10 rows by ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT
10)``, and each finished task deleted.

The table and its index are the raw-SQL row's (``benchmarks.rawsql.SCHEMA``). The worker is one
process: its main thread claims while fewer than ``concurrency + PREFETCH`` tasks are in hand
(polling every ``IDLE_POLL`` when it finds none), and ``concurrency`` threads, each on a
connection of its own, run the tasks (``benchmarks.mixed.app.run_task``) and delete them.
Usage: ``python -m benchmarks.mixed.classic worker --concurrency 8``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import signal
import sys
import threading
from typing import Any

import psycopg

from benchmarks.mixed import app
from benchmarks.rawsql import SCHEMA

TABLE = "raw_task"
TASK = "touch"
CLAIM_LIMIT = 10  # rows per claim, as the classic queue
PREFETCH = 2  # tasks claimed beyond the free threads: django-sqltasks' default at concurrency 8
IDLE_POLL = 0.010  # seconds between claims that found nothing (benchmarks.rawsql's)

INSERT = f"INSERT INTO {TABLE} (task, args) VALUES (%s, %s)"
CLAIM = f"""
UPDATE {TABLE} SET status = 1, started_at = now()
WHERE id IN (
    SELECT id FROM {TABLE} WHERE queue = 'default' AND status = 0
    ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
)
RETURNING id, args
"""
FINISH = f"DELETE FROM {TABLE} WHERE id = %s"


def create(cursor: Any) -> None:
    cursor.execute(SCHEMA)
    cursor.execute(f"TRUNCATE {TABLE} RESTART IDENTITY")


def enqueue(cursor: Any, seq: int, enqueued_at: float, port: int, account: int) -> None:
    cursor.execute(INSERT, (TASK, json.dumps([seq, enqueued_at, port, account])))


class Worker:
    """Claims on the main thread; runs and deletes on ``concurrency`` threads."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.url = url
        self.concurrency = concurrency
        self.stopping = threading.Event()
        # Claimed tasks not yet finished; the main thread waits on it when its hands are full.
        self.in_hand = threading.Semaphore(concurrency + PREFETCH)
        self.ready: queue.Queue[tuple[int, list[Any]] | None] = queue.Queue()

    def run(self) -> None:
        threads = [threading.Thread(target=self._execute) for _ in range(self.concurrency)]
        for thread in threads:
            thread.start()
        try:
            with psycopg.connect(self.url, autocommit=True, application_name="classic") as conn:
                self._claim_loop(conn)
        finally:
            self.stopping.set()
            for _ in threads:
                self.ready.put(None)
            for thread in threads:
                thread.join()

    def _claim_loop(self, conn: psycopg.Connection[Any]) -> None:
        while not self.stopping.is_set():
            if not self.in_hand.acquire(timeout=0.1):
                continue
            free = 1
            while free < CLAIM_LIMIT and self.in_hand.acquire(blocking=False):
                free += 1
            rows = conn.execute(CLAIM, (free,)).fetchall()
            for row in rows:
                self.ready.put(row)
            for _ in range(free - len(rows)):
                self.in_hand.release()
            if not rows:
                self.stopping.wait(IDLE_POLL)

    def _execute(self) -> None:
        with psycopg.connect(self.url, autocommit=True, application_name="classic") as conn:
            cursor = conn.cursor()
            while (item := self.ready.get()) is not None:
                task_id, args = item
                try:
                    app.run_task(cursor, *args)
                    cursor.execute(FINISH, (task_id,))
                except psycopg.Error as e:  # the task stays claimed: the report counts it lost
                    print(f"task id={task_id} failed: {e!r}", file=sys.stderr, flush=True)
                finally:
                    self.in_hand.release()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mixed.classic")
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker")
    worker.add_argument("--url", required=True)
    worker.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    runner = Worker(args.url, args.concurrency)
    signal.signal(signal.SIGTERM, lambda signum, frame: runner.stopping.set())
    with contextlib.suppress(KeyboardInterrupt):
        runner.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
