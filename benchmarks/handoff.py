"""The bare-SQL hand-over: a prototype of a task handed by its enqueue to a worker that waits idle.

The floor (``benchmarks.floor``) has two round trips from an enqueue to a task's start: the
enqueue's statement, then the worker's claim. Here an idle worker keeps an offer (one row of its
own, named after its own channel) and the enqueue's one autocommit statement takes it: it locks an
idle offer ``FOR UPDATE SKIP LOCKED`` when no ready task comes first, inserts the task already
running for that worker, marks the offer taken and notifies the worker's channel with the task's
id, name and arguments, so the worker starts it on the notification, with no claim. Without an
offer the task is inserted ready and the common channel is notified; a worker woken there claims
as the floor's does. After a task, one statement marks it done and offers the worker again.

A prototype of a design django-sqltasks does not use (docs/design/performance-history.md,
lever 6), for its ceiling. It omits what a product would need: a handed task whose
notification is lost (the connection drops after the enqueue's commit) stays running for a
worker that does not know of it, and an offer outlives a worker that dies. PostgreSQL only.
Usage: ``python -m benchmarks.handoff worker``; ``python -m benchmarks.handoff cost -n 5000``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg

from benchmarks import floor
from benchmarks.rawsql import conninfo
from benchmarks.systems.base import Endpoints

DATABASE_NAME = "bench_sql_handoff"
CHANNEL = "handoff_task"  # the common channel: a task inserted ready
WAIT_SECONDS = 60.0  # as the floor's: bounds a wait whose notification never comes
# The cost's figures, in µs per enqueue, and their headings.
FIGURES = ("client_cpu_us", "server_cpu_us", "wall_us", "wall_p50_us")
HEADINGS = ("client CPU", "server CPU", "wall, mean", "wall, p50")

SCHEMA = """
CREATE TABLE IF NOT EXISTS handoff_task (
    id bigserial PRIMARY KEY,
    task text NOT NULL,
    args jsonb NOT NULL,
    state smallint NOT NULL DEFAULT 0,
    worker text
);
CREATE INDEX IF NOT EXISTS handoff_task_ready ON handoff_task (id) WHERE state = 0;
CREATE TABLE IF NOT EXISTS handoff_offer (worker text PRIMARY KEY, idle boolean NOT NULL);
"""

# The offer is updated, not deleted: no indexed column changes, so the update stays HOT.
ENQUEUE = f"""
WITH offer AS (
    UPDATE handoff_offer SET idle = false WHERE worker = (
        SELECT worker FROM handoff_offer
        WHERE idle AND NOT EXISTS (SELECT FROM handoff_task WHERE state = 0)
        LIMIT 1 FOR UPDATE SKIP LOCKED
    ) RETURNING worker
), task AS (
    INSERT INTO handoff_task (task, args, state, worker)
    SELECT %s, %s::jsonb, CASE WHEN offer.worker IS NULL THEN 0 ELSE 1 END, offer.worker
    FROM (VALUES (1)) AS one LEFT JOIN offer ON true
    RETURNING id, task, args, worker
)
SELECT pg_notify(
    coalesce(worker, '{CHANNEL}'),
    CASE WHEN worker IS NULL THEN '' ELSE json_build_array(id, task, args)::text END
) FROM task
"""
OFFER = (
    "INSERT INTO handoff_offer (worker, idle) VALUES (%(worker)s, true) "
    "ON CONFLICT (worker) DO UPDATE SET idle = true"
)
# Woken on the common channel: claim as the floor does, and withdraw the offer if a task came.
CLAIM = """
WITH claimed AS (
    UPDATE handoff_task SET state = 1, worker = %(worker)s WHERE id = (
        SELECT id FROM handoff_task WHERE state = 0 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED
    ) RETURNING id, task, args
), withdrawn AS (
    UPDATE handoff_offer SET idle = false
    WHERE worker = %(worker)s AND EXISTS (SELECT FROM claimed)
)
SELECT id, task, args FROM claimed
"""
DONE_AND_OFFER = f"""
WITH done AS (UPDATE handoff_task SET state = 2 WHERE id = %(id)s)
{OFFER}
"""


def create_schema(endpoints: Endpoints) -> None:
    floor.create_schema(endpoints, DATABASE_NAME, SCHEMA)


def truncate(endpoints: Endpoints) -> None:
    floor.truncate(endpoints, DATABASE_NAME, "handoff_task, handoff_offer")


async def enqueue_one(task: str, args: list[Any]) -> None:
    """Insert one task, handed to an idle worker if one is offered, in one statement."""
    await floor.enqueue_one(task, args, DATABASE_NAME, ENQUEUE)


def work() -> None:
    """Run each task handed over on the worker's channel; claim those left ready; offer again."""
    channel = f"handoff_worker_{os.getpid()}"
    with psycopg.connect(**conninfo(Endpoints.from_env(), DATABASE_NAME), autocommit=True) as conn:
        conn.execute(f"LISTEN {channel}")
        conn.execute(f"LISTEN {CHANNEL}")
        conn.execute(OFFER, {"worker": channel})
        conn.execute(f"NOTIFY {CHANNEL}")  # claim what was left ready before the offer
        while True:
            # psycopg keeps the notifications that arrive during a statement for the next call.
            for note in list(conn.notifies(timeout=WAIT_SECONDS, stop_after=1)):
                if note.channel == channel:
                    task_id, task, args = json.loads(note.payload)
                elif (row := conn.execute(CLAIM, {"worker": channel}).fetchone()) is not None:
                    task_id, task, args = row
                else:
                    continue
                floor.run_task(task, args)
                conn.execute(DONE_AND_OFFER, {"id": task_id, "worker": channel})


def _server_cpu_seconds(conn: psycopg.Connection[Any]) -> float:
    """Return the CPU time of the connection's server process (the kernel's, in nanoseconds)."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    with open(f"/proc/{row[0]}/schedstat") as stat:
        return int(stat.read().split()[0]) / 1e9


def _cost_round(
    conns: dict[str, psycopg.Connection[Any]], offer: Callable[[], None] | None, n: int
) -> dict[str, dict[str, float]]:
    """Run ``n`` enqueues of each statement, alternated, each on its own connection; return
    the client's CPU, the server process's CPU and the wall time, in µs per enqueue."""
    statements = {"floor": floor.ENQUEUE, "handoff": ENQUEUE}
    server = {name: _server_cpu_seconds(conn) for name, conn in conns.items()}
    cpu = dict.fromkeys(conns, 0.0)
    walls: dict[str, list[float]] = {name: [] for name in conns}
    args = json.dumps([0, 0.0, 0])
    for i in range(n):
        for name in sorted(conns, reverse=i % 2 == 1):
            if name == "handoff" and offer is not None:
                offer()
            cpu_started, wall_started = time.thread_time(), time.perf_counter()
            conns[name].execute(statements[name], ("noop", args))
            cpu[name] += time.thread_time() - cpu_started
            walls[name].append(time.perf_counter() - wall_started)
    return {
        name: {
            "client_cpu_us": cpu[name] / n * 1e6,
            # Less the one statement that reads it, alike for both.
            "server_cpu_us": (_server_cpu_seconds(conns[name]) - server[name]) / n * 1e6,
            "wall_us": sum(walls[name]) / n * 1e6,
            "wall_p50_us": statistics.median(walls[name]) * 1e6,
        }
        for name in conns
    }


def cost(n: int, runs: int) -> list[dict[str, Any]]:
    """Time the floor's enqueue against the hand-over's: with no offer, with the worker's offer
    taken (a busy worker) and with an idle offer taken by each enqueue (given back, untimed)."""
    endpoints = Endpoints.from_env()
    create_schema(endpoints)
    info = conninfo(endpoints, DATABASE_NAME)
    with (
        psycopg.connect(**info, autocommit=True) as admin,
        psycopg.connect(**info, autocommit=True) as plain,
        psycopg.connect(**info, autocommit=True) as handing,
    ):
        admin.execute(floor.SCHEMA)

        def offer() -> None:
            admin.execute(OFFER, {"worker": "handoff_worker_cost"})

        results = []
        for run in range(runs):
            for case in ("no offer", "busy worker", "idle worker"):
                admin.execute("TRUNCATE floor_task, handoff_task, handoff_offer RESTART IDENTITY")
                if case == "busy worker":
                    admin.execute("INSERT INTO handoff_offer VALUES ('handoff_worker_cost', false)")
                admin.execute("VACUUM ANALYZE floor_task, handoff_task, handoff_offer")
                conns = {"floor": plain, "handoff": handing}
                measured = _cost_round(conns, offer if case == "idle worker" else None, n)
                results.append({"run": run, "case": case, "n": n, **measured})
                print(json.dumps(results[-1]), flush=True)
    return results


def summary(results: list[dict[str, Any]]) -> str:
    """Median over the runs of each figure, a line per case and statement."""
    lines = [f"{'µs per enqueue':<24}" + "".join(f"{h:>14}" for h in HEADINGS)]
    for case in dict.fromkeys(r["case"] for r in results):
        for name in ("floor", "handoff"):
            rows = [r[name] for r in results if r["case"] == case]
            figures = [statistics.median(row[k] for row in rows) for k in FIGURES]
            lines.append(f"{case + ', ' + name:<24}" + "".join(f"{f:>14.1f}" for f in figures))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.handoff")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("worker")
    cost_parser = sub.add_parser("cost", help="time N enqueues of the floor's and ours, alternated")
    cost_parser.add_argument("-n", type=int, default=5000)
    cost_parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    if args.command == "cost":
        print(summary(cost(args.n, args.runs)))
        return 0
    with contextlib.suppress(KeyboardInterrupt):
        work()
    return 0


if __name__ == "__main__":
    sys.exit(main())
