"""Time the admin's queue overview with many queues: its page as a superuser gets it (wall time,
bytes, queries), and the same page again as the live update fetches it. Fills the database
first, if it holds no task: QUEUES queues with a few due, running and finished tasks each.
Usage: DATABASE_URL=postgres://... python scripts/overview_scale.py [QUEUES] [RUNS]
(the database must be migrated: ``python -m django migrate --settings tests.settings``)."""

from __future__ import annotations

import os
import statistics
import sys
import time
from datetime import timedelta

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import django

django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.db import connection, reset_queries  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.urls import reverse  # noqa: E402
from django.utils import timezone  # noqa: E402

from django_sqltasks.compat import TaskResultStatus  # noqa: E402
from django_sqltasks.models import TaskRecord  # noqa: E402
from tests.factories import insert_rows  # noqa: E402


def fill(queues: int) -> None:
    """Per queue: i % 7 due tasks, one running in every tenth, two finished in the hour."""
    now = timezone.now()
    template = TaskRecord(task_path="tests.tasks.noop", backend_name="default")
    rows: list[dict[str, object]] = []
    for q in range(queues):
        name = f"q{q:05d}"
        rows += [{"queue_name": name, "available_at": now - timedelta(seconds=q)}] * (q % 7)
        if q % 10 == 0:
            rows.append({"queue_name": name, "status": TaskResultStatus.RUNNING, "owner": "w"})
        for status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED):
            rows.append(
                {"queue_name": name, "status": status, "finished_at": now - timedelta(minutes=5)}
            )
    insert_rows(template, len(rows), lambda i: rows[i])
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {TaskRecord._meta.db_table}")


def main() -> None:
    queues = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    if not TaskRecord.objects.exists():
        fill(queues)
    user, _ = User.objects.get_or_create(
        username="overview-scale", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    url = reverse("admin:django_sqltasks_queueoverview_changelist")
    for name, headers in (("page", {}), ("live update", {"X-SQLTasks-Live": "1"})):
        walls, size, count = [], 0, 0
        for _ in range(runs):
            reset_queries()
            with CaptureQueriesContext(connection) as queries:
                start = time.perf_counter()
                response = client.get(url, headers=headers)
                walls.append(time.perf_counter() - start)
            assert response.status_code == 200, response.status_code
            size, count = len(response.content), len(queries)
        print(
            f"{name}: {queues:,} queues, median {statistics.median(walls):.3f} s of {runs} "
            f"(min {min(walls):.3f}, max {max(walls):.3f}), {size:,} bytes, {count} queries"
        )


if __name__ == "__main__":
    main()
