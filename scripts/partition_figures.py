"""Time the claim and a read by id on the task table of DATABASE_URL, server-side (EXPLAIN
ANALYZE, median of N runs, each rolled back): run beside a big history, then on a table of
live tasks only, to compare. Usage: DATABASE_URL=... python scripts/partition_figures.py [N]"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import django

django.setup()

from django.db import connection, transaction  # noqa: E402

from django_sqltasks.sql import dialect_for  # noqa: E402


def timed(sql: str, params: list[Any]) -> tuple[float, float]:
    """Planning and execution time of ``sql``, in ms, rolled back."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
        plan = plan[0] if isinstance(plan, list) else plan
        transaction.set_rollback(True)
    return plan["Planning Time"], plan["Execution Time"]


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    table = "django_sqltasks_taskrecord"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table} WHERE status = 'READY'")
        ready = cursor.fetchone()[0]
        cursor.execute(
            f"SELECT id FROM {table} WHERE status = 'SUCCESSFUL' ORDER BY id LIMIT 1 OFFSET 1000"
        )
        row = cursor.fetchone()
        cursor.execute(f"SELECT id FROM {table} WHERE status = 'READY' LIMIT 1")
        any_id = row[0] if row else cursor.fetchone()[0]
        cursor.execute(
            "SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree(%s) WHERE isleaf",
            [table],
        )
        size = cursor.fetchone()[0]
    claim_sql, claim_params = dialect_for(connection).claim_sql(
        backend_name="default", queue_names=None, worker_id="figures", limit=10
    )
    by_id = f"SELECT * FROM {table} WHERE id = %s AND backend_name = %s"
    for name, (sql, params) in {
        "claim of 10": (claim_sql, claim_params),
        "read by id": (by_id, [any_id, "default"]),
    }.items():
        timed(sql, params)  # warm
        times = [timed(sql, params) for _ in range(runs)]
        plan_ms = statistics.median(t[0] for t in times)
        exec_ms = statistics.median(t[1] for t in times)
        print(
            f"{name}: planning {plan_ms:.3f} ms, execution {exec_ms:.3f} ms "
            f"(median of {runs}; {ready} READY, table {size / 2**20:.0f} MB)"
        )


if __name__ == "__main__":
    main()
