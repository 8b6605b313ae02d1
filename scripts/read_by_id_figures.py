"""Time a read by id on PostgreSQL's partitioned task table, server-side (EXPLAIN ANALYZE,
planning + execution, median of N runs), as it was (over every partition) and as
``TaskRecordQuerySet.with_id`` reads it (the live partition and the days from the id's on).
Gives the table DAYS days of history partitions first, and drops them after.
Usage: DATABASE_URL=postgres://... python scripts/read_by_id_figures.py [N] [DAYS]"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid
from datetime import timedelta
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.utils import timezone  # noqa: E402

from django_sqltasks.compat import task_backends  # noqa: E402
from django_sqltasks.ids import first_id_at  # noqa: E402
from django_sqltasks.models import TaskRecord  # noqa: E402
from django_sqltasks.sql import partitions as sql  # noqa: E402
from django_sqltasks.store import partitions  # noqa: E402
from tests.factories import task_row  # noqa: E402


def timed(query: Any) -> float:
    """Planning plus execution time of ``query``, in ms."""
    statement, params = query.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
        plan = cursor.fetchone()[0]
    plan = plan[0] if isinstance(plan, list) else plan
    return float(plan["Planning Time"] + plan["Execution Time"])


def wall(task_id: uuid.UUID, runs: int) -> str:
    """The median wall time of get_result, client-side."""
    backend = task_backends["default"]
    backend.get_result(str(task_id))
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        backend.get_result(str(task_id))
        walls.append((time.perf_counter() - start) * 1000)
    return f"wall time median {statistics.median(walls):.3f} ms ({runs} runs)"


def leaves(query: Any) -> int:
    return sum(" on django_sqltasks_taskrecord_" in line for line in query.explain().splitlines())


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 31
    days = int(sys.argv[2]) if len(sys.argv) > 2 else 27
    call_command("migrate", verbosity=0)
    today = timezone.now().astimezone(sql.dt_timezone.utc).date()
    partitions.add_days("default", days_ahead=days, today=today - timedelta(days=days))
    # Enqueued two days ago (its UUIDv7 id says so), finished today.
    two_days_ago = first_id_at(timezone.now() - timedelta(days=2)).int
    made = uuid.UUID(int=two_days_ago | 0b10 << 62 | int.from_bytes(os.urandom(7), "big"))
    task_row("SUCCESSFUL", id=made)
    try:
        with connection.cursor() as cursor:
            count = len(list(sql.day_partitions(cursor, TaskRecord._meta.db_table, "SUCCESSFUL")))
        print(f"day partitions per finished status: {count}")
        reads = {
            "plain filter(id=...)": TaskRecord.objects.filter(id=made, backend_name="default"),
            "with_id(...)": TaskRecord.objects.with_id(made, partitioned=True).filter(
                backend_name="default"
            ),
        }
        for name, query in reads.items():
            timed(query)  # warm
            times = [timed(query) for _ in range(runs)]
            print(
                f"{name}: {leaves(query)} partitions scanned, planning+execution median "
                f"{statistics.median(times):.3f} ms (min {min(times):.3f}, max {max(times):.3f}, "
                f"{runs} runs)"
            )
        for partitioned in (False, True):
            # As if the last look at the layout had found it plain (before), or partitioned.
            partitions._layouts["default"] = (partitioned, time.monotonic())
            print(f"get_result, {'with_id' if partitioned else 'plain'}: {wall(made, runs)}")
    finally:
        TaskRecord.objects.filter(pk=made).delete()
        with connection.cursor() as cursor:
            for status in sql.HISTORY:
                for p in sql.day_partitions(cursor, TaskRecord._meta.db_table, status):
                    if p.day < today:
                        with transaction.atomic():
                            for statement in sql.drop_statements(p.name):
                                cursor.execute(statement)


if __name__ == "__main__":
    main()
