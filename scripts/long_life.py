"""Claim time over a long life: drain a large backlog, with and without an old snapshot open.

Out of CI; see docs/reliability.md. It starts a private PostgreSQL server with autovacuum on
(the default) and, for each phase, enqueues ``--tasks`` tasks, then drains them through the
claim and completion statements the worker uses (``--batch`` per claim, one process), timing
every claim. Phases:

- ``plain``: nothing else runs;
- ``snapshot``: another connection holds a ``REPEATABLE READ`` snapshot for the whole drain, so
  vacuum can remove no row version the drain leaves behind;
- ``deferred`` (with ``--deferred N``): claim speed of due tasks beside N READY tasks of a
  higher priority whose ``run_after`` is a year away (rows that are not due).

    .venv/bin/python scripts/long_life.py --phases plain --tasks 1000000 [--tuned]
    .venv/bin/python scripts/long_life.py --phases snapshot --snapshot-tasks 500000
    .venv/bin/python scripts/long_life.py --phases deferred --deferred 1000000 --json out.json

With a snapshot open, each claim walks every index entry the drain has left behind, so the
drain's time grows with the square of its size: 1,000,000 tasks take hours on two cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from soak import ENQUEUE_CHUNK, TABLE, _rows, django_setup, log, scalar

from tests.gauntlet_postgres import PrivatePostgres, find_bindir

WINDOW = 0.02  # fraction of the drain whose claims make each start / middle / end figure
DEFERRED_CLAIMS = 200  # claims timed beside the deferred rows
BACKLOG_CLAIMS = 20  # claims timed beside each backlog of due rows
# docs/operations.md's autovacuum settings for the task table (--tuned).
TUNED = (
    "autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000, "
    "autovacuum_vacuum_cost_delay = 0"
)


def enqueue(count: int, priority: int = 0) -> float:
    from tests import tasks

    task = tasks.noop.using(priority=priority)
    backend = task.get_backend()
    started = time.monotonic()
    for start in range(0, count, ENQUEUE_CHUNK):
        backend.enqueue_many(task, [((), {})] * min(ENQUEUE_CHUNK, count - start))  # type: ignore[attr-defined]
    return time.monotonic() - started


def reset() -> None:
    _rows(f"TRUNCATE {TABLE}")
    _rows(f"VACUUM ANALYZE {TABLE}")


def vacuum_stats() -> dict[str, Any]:
    row = _rows(
        "SELECT n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count "
        f"FROM pg_stat_user_tables WHERE relname = '{TABLE}'"
    )[0]
    return dict(zip(("live", "dead", "autovacuums", "autoanalyzes"), row, strict=True))


def drain(
    batch: int, queue_names: list[str] | None = None
) -> tuple[list[tuple[int, float]], float]:
    """Claim and complete every due task (a worker on ``queue_names``, or on every queue);
    return (tasks drained before, claim seconds) per claim, and the drain's wall time."""
    from django.db import connection
    from django.utils import timezone

    from django_sqltasks.sql import Outcome, dialect_for

    dialect = dialect_for(connection)
    timings: list[tuple[int, float]] = []
    drained = 0
    started = time.monotonic()
    with connection.cursor() as cursor:
        while True:
            t0 = time.perf_counter()
            rows = dialect.claim(
                cursor,
                backend_name="default",
                queue_names=queue_names,
                worker_id="drain",
                limit=batch,
            )
            timings.append((drained, time.perf_counter() - t0))
            if not rows:
                break
            now = timezone.now()
            dialect.complete(
                cursor, "drain", [Outcome(r.id, "SUCCESSFUL", now, "null") for r in rows]
            )
            drained += len(rows)
            if len(timings) % 2000 == 0:
                log(f"  {drained} drained, last claim {timings[-1][1] * 1000:.2f} ms")
    return timings[:-1], time.monotonic() - started


def at(timings: list[tuple[int, float]], total: int, fraction: float) -> float:
    """Median claim time in ms over the WINDOW of the drain starting at ``fraction``."""
    low = total * min(fraction, 1 - WINDOW)
    chosen = [s for n, s in timings if low <= n < low + total * WINDOW]
    return round(statistics.median(chosen) * 1000, 2)


def drain_phase(count: int, batch: int, snapshot: bool, url: str) -> dict[str, Any]:
    import psycopg

    reset()
    seconds = enqueue(count)
    phase = "old snapshot open" if snapshot else "plain"
    log(f"enqueued {count} in {seconds:.1f}s; draining ({phase})")
    holder = None
    if snapshot:
        holder = psycopg.connect(url)
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute(f"SELECT count(*) FROM {TABLE}").fetchone()  # takes the snapshot
    try:
        timings, elapsed = drain(batch)
    finally:
        if holder is not None:
            holder.close()
    figures = {
        "tasks": count,
        "batch": batch,
        "old_snapshot": snapshot,
        "drain_s": round(elapsed, 1),
        "tasks_per_s": round(count / elapsed),
        "claim_ms": {
            "start": at(timings, count, 0.0),
            "middle": at(timings, count, 0.5),
            "end": at(timings, count, 1.0),
        },
        "claim_ms_by_tenth": [at(timings, count, i / 10) for i in range(10)],
        "table_after": vacuum_stats(),
    }
    log(json.dumps(figures))
    return figures


def deferred_phase(deferred: int, batch: int) -> dict[str, Any]:
    """Claim time of due priority-0 tasks beside ``deferred`` priority-10 tasks a year away."""
    from tests import tasks

    results: dict[str, dict[int, float]] = {"every_queue": {}, "one_queue": {}}
    plans = {}
    for n in sorted({0, deferred // 10, deferred}):
        reset()
        if n:
            scalar(
                f"""
                INSERT INTO {TABLE} (id, task_path, backend_name, queue_name, priority, status,
                    args, kwargs, errors, worker_ids, attempts, enqueued_at, run_after,
                    available_at)
                SELECT gen_random_uuid(), 'tests.tasks.noop', 'default', 'default', 10, 'READY',
                    '[]', '{{}}', '[]', '[]', 0, now(), now() + interval '1 year',
                    now() + interval '1 year'
                FROM generate_series(1, %s)
                """,
                [n],
            )
        backend = tasks.noop.get_backend()
        for kind, queue_names in (("every_queue", None), ("one_queue", ["default"])):
            backend.enqueue_many(tasks.noop, [((), {})] * (DEFERRED_CLAIMS * batch))  # type: ignore[attr-defined]
            _rows(f"VACUUM ANALYZE {TABLE}")
            plans[f"{kind}_{n}"] = explain_claim(batch, queue_names)
            timings, _ = drain(batch, queue_names)
            results[kind][n] = round(statistics.median(s for _, s in timings) * 1000, 2)
            log(f"  {n} deferred rows, {kind}: median claim {results[kind][n]} ms")
    return {"deferred_priority_10_rows": results, "batch": batch, "plans": plans}


def backlog_phase(largest: int, batch: int) -> dict[str, Any]:
    """Claim time of a worker on one queue and on every queue beside a backlog of due tasks."""
    results: dict[str, dict[int, float]] = {"every_queue": {}, "one_queue": {}}
    plans = {}
    for n in (largest // 100, largest // 10, largest):
        for kind, queue_names in (("every_queue", None), ("one_queue", ["default"])):
            reset()
            insert_ready(n, priority=0, deferred=False)
            _rows(f"VACUUM ANALYZE {TABLE}")
            plans[f"{kind}_{n}"] = explain_claim(batch, queue_names)
            timings = []
            for _ in range(BACKLOG_CLAIMS):
                t0 = time.perf_counter()
                claim_once(batch, queue_names)
                timings.append(time.perf_counter() - t0)
            results[kind][n] = round(statistics.median(timings) * 1000, 2)
            log(f"  {n} due rows, {kind}: median claim {results[kind][n]} ms")
    return {"due_rows": results, "batch": batch, "plans": plans}


def claim_once(batch: int, queue_names: list[str] | None) -> None:
    from django.db import connection

    from django_sqltasks.sql import dialect_for

    with connection.cursor() as cursor:
        dialect_for(connection).claim(
            cursor, backend_name="default", queue_names=queue_names, worker_id="bl", limit=batch
        )


def insert_ready(count: int, priority: int, deferred: bool) -> None:
    """Insert ``count`` READY tasks in one statement, due now or a year away."""
    when = "now() + interval '1 year'" if deferred else "now()"
    scalar(
        f"""
        INSERT INTO {TABLE} (id, task_path, backend_name, queue_name, priority, status,
            args, kwargs, errors, worker_ids, attempts, enqueued_at, run_after, available_at)
        SELECT gen_random_uuid(), 'tests.tasks.noop', 'default', 'default', %s, 'READY',
            '[]', '{{}}', '[]', '[]', 0, now(), {when}, {when}
        FROM generate_series(1, %s)
        """,
        [priority, count],
    )


def explain_claim(batch: int, queue_names: list[str] | None) -> str:
    """The claim's plan as run (EXPLAIN ANALYZE runs it: it claims ``batch`` tasks)."""
    from django.db import connection

    from django_sqltasks.sql import dialect_for

    sql, params = dialect_for(connection).claim_sql(
        backend_name="default", queue_names=queue_names, worker_id="explain", limit=batch
    )
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument(
        "--snapshot-tasks", type=int, help="tasks for the snapshot phase (default: --tasks)"
    )
    parser.add_argument("--batch", type=int, default=50, help="tasks per claim")
    parser.add_argument("--deferred", type=int, default=0, help="rows for the deferred phase")
    parser.add_argument("--phases", default="plain,snapshot,deferred")
    parser.add_argument(
        "--tuned",
        action="store_true",
        help="set the task table's autovacuum thresholds docs/operations.md recommends",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    bindir = find_bindir()
    if bindir is None:
        parser.error("no PostgreSQL binaries")
    server = PrivatePostgres(bindir, f"longlife_{uuid.uuid4().hex[:6]}").init()
    figures: dict[str, Any] = {}
    try:
        django_setup(server.url, 30.0)
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        if args.tuned:
            _rows(f"ALTER TABLE {TABLE} SET ({TUNED})")
        figures["server"] = {
            "version": scalar("SHOW server_version"),
            "autovacuum": scalar("SHOW autovacuum"),
            "table_options": scalar(
                "SELECT reloptions::text FROM pg_class WHERE relname = %s", [TABLE]
            ),
        }
        phases = args.phases.split(",")
        for snapshot in (False, True):
            if ("snapshot" if snapshot else "plain") in phases:
                key = "snapshot" if snapshot else "plain"
                count = args.snapshot_tasks if snapshot and args.snapshot_tasks else args.tasks
                figures[key] = drain_phase(count, args.batch, snapshot, server.url)
        if "backlog" in phases:
            figures["backlog"] = backlog_phase(args.tasks, args.batch)
        if "deferred" in phases and args.deferred:
            figures["deferred"] = deferred_phase(args.deferred, args.batch)
        print(json.dumps(figures, indent=2))
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2) + "\n")
        return 0
    finally:
        from django.db import connections

        connections.close_all()
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
