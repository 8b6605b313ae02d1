"""Claim time beside READY tasks that are not due, on the database ``DATABASE_URL`` names.

Out of CI; see docs/reliability.md ("Rows that are not due"). The table is made to hold
``--deferred`` READY tasks of priority 10 due in a year (each a second apart; kept between
runs when the count matches, so that runs of two commits can alternate on the same rows).
Each round then enqueues ``--claims`` x ``--batch`` due tasks of priority 0, vacuums and
analyzes the table, and times ``--claims`` claims of ``--batch`` tasks through the worker's
own claim and completion statements (one process, no task code run), for a worker on every
queue and one on a single queue. It prints the median claim time of each round and of all.

    DATABASE_URL=postgres://... .venv/bin/python scripts/deferred_claims.py --deferred 1000000

SQLite (no ``DATABASE_URL``) uses ``SQLTASKS_SQLITE_PATH``, as the tests do. The script
deletes every row of that database's task table: point it at a scratch database.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TABLE = "django_sqltasks_taskrecord"
COLUMNS = (
    "id, task_path, backend_name, queue_name, priority, status, args, kwargs, errors, "
    "worker_ids, attempts, enqueued_at, run_after, available_at, snoozes, rescues, "
    "cancel_requested, progress"
)
# N rows of priority 10, the i-th due in a year and i seconds, in one statement per vendor.
INSERT_DEFERRED = {
    "postgresql": f"""
        INSERT INTO {TABLE} ({COLUMNS})
        SELECT gen_random_uuid(), 'tests.tasks.noop', 'default', 'default', 10, 'READY',
            '[]', '{{}}', '[]', '[]', 0, now(), now() + interval '1 year' + i * interval '1 s',
            now() + interval '1 year' + i * interval '1 s', 0, 0, false, 'null'
        FROM generate_series(1, %s) AS i
    """,
    "mysql": f"""
        INSERT INTO {TABLE} ({COLUMNS})
        SELECT REPLACE(UUID(), '-', ''), 'tests.tasks.noop', 'default', 'default', 10, 'READY',
            '[]', '{{}}', '[]', '[]', 0, UTC_TIMESTAMP(6),
            UTC_TIMESTAMP(6) + INTERVAL 1 YEAR + INTERVAL seq SECOND,
            UTC_TIMESTAMP(6) + INTERVAL 1 YEAR + INTERVAL seq SECOND, 0, 0, 0, 'null'
        FROM seq_1_to_{{count}}
    """,
    "sqlite": f"""
        WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %s)
        INSERT INTO {TABLE} ({COLUMNS})
        SELECT lower(hex(randomblob(16))), 'tests.tasks.noop', 'default', 'default', 10,
            'READY', '[]', '{{}}', '[]', '[]', 0, datetime('now'),
            strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+1 year', '+' || i || ' seconds'),
            strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+1 year', '+' || i || ' seconds'),
            0, 0, 0, 'null'
        FROM n
    """,
}


def execute(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []


def tidy() -> None:
    """Remove dead rows and refresh the planner's statistics."""
    from django.db import connection

    vendor = connection.vendor
    if vendor == "postgresql":
        execute(f"VACUUM ANALYZE {TABLE}")
    elif vendor == "mysql":
        execute(f"ANALYZE TABLE {TABLE}")
    else:
        execute("ANALYZE")


def ensure_deferred(count: int) -> None:
    """Leave exactly ``count`` deferred priority-10 rows and nothing else in the table."""
    from django.db import connection

    execute(f"DELETE FROM {TABLE} WHERE priority <> 10")
    if execute(f"SELECT COUNT(*) FROM {TABLE}")[0][0] == count:
        return
    execute(f"DELETE FROM {TABLE}")
    if count:
        vendor = connection.vendor
        if vendor == "mysql":  # the sequence engine's table names its end
            execute(INSERT_DEFERRED[vendor].replace("{count}", str(int(count))))
        else:
            execute(INSERT_DEFERRED[vendor], [count])
    tidy()


def one_round(claims: int, batch: int, queue_names: list[str] | None) -> list[float]:
    """Enqueue due tasks for ``claims`` claims, then time those claims (seconds each)."""
    from django.db import connection
    from django.utils import timezone

    from django_sqltasks.sql import Outcome, dialect_for
    from tests import tasks

    backend = tasks.noop.get_backend()
    backend.enqueue_many(tasks.noop, [((), {})] * (claims * batch))  # type: ignore[attr-defined]
    tidy()
    dialect = dialect_for(connection)
    timings = []
    with connection.cursor() as cursor:
        for _ in range(claims):
            started = time.perf_counter()
            rows = dialect.claim(
                cursor,
                backend_name="default",
                queue_names=queue_names,
                worker_id="bench",
                limit=batch,
            )
            timings.append(time.perf_counter() - started)
            now = timezone.now()
            dialect.complete(
                cursor, "bench", [Outcome(r.id, "SUCCESSFUL", now, "null") for r in rows]
            )
    execute(f"DELETE FROM {TABLE} WHERE priority <> 10")
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deferred", type=int, default=1_000_000)
    parser.add_argument("--claims", type=int, default=200, help="claims timed per round")
    parser.add_argument("--batch", type=int, default=50, help="tasks per claim")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--label", default="", help="a name for this run in the output")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    import django_sqltasks

    call_command("migrate", verbosity=0, skip_checks=True)
    ensure_deferred(args.deferred)
    figures: dict[str, Any] = {
        "label": args.label,
        "package": str(Path(django_sqltasks.__file__).parent),
        "vendor": connection.vendor,
        "deferred": args.deferred,
        "batch": args.batch,
    }
    for kind, queue_names in (("every_queue", None), ("one_queue", ["default"])):
        rounds = [one_round(args.claims, args.batch, queue_names) for _ in range(args.rounds)]
        figures[kind] = {
            "median_ms": round(statistics.median(t for r in rounds for t in r) * 1000, 3),
            "round_medians_ms": [round(statistics.median(r) * 1000, 3) for r in rounds],
        }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
