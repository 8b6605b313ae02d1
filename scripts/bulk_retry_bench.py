"""Retry N failed tasks through the admin's "Select all" and a worker, on a PostgreSQL database
of its own (created, then dropped): the confirmation page's time, the request that queues the
job, and the job's run to its end on a burst worker. Prints the figures and the load average.

    .venv/bin/python scripts/bulk_retry_bench.py --rows 1000000 --database sqltasks_bulk_bench
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The history scripts/fill_history.sql writes, every task of it then FAILED on a queue the
# benchmark's worker does not serve, so that only the job runs.
ALL_FAILED = """
UPDATE django_sqltasks_taskrecord SET status = 'FAILED', queue_name = 'other',
    errors = '[{"exception_class_path": "builtins.ValueError", "traceback": "boom"}]'
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--database", default="sqltasks_bulk_bench")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    url = f"postgres://postgres@{args.host}:5432/{args.database}"
    os.environ.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="tests.settings")
    sys.path.insert(0, str(ROOT))
    psql = ["psql", "-h", args.host, "-U", "postgres", "-q", "-X"]
    subprocess.run([*psql, "-c", f"CREATE DATABASE {args.database}"], check=True)
    try:
        run(args.rows, psql, args.database)
    finally:
        subprocess.run([*psql, "-c", f"DROP DATABASE {args.database} WITH (FORCE)"], check=True)


def run(rows: int, psql: list[str], database: str) -> None:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.urls import reverse

    from django_sqltasks.models import TaskRecord

    call_command("migrate", verbosity=0)
    started = time.monotonic()
    fill = ["-v", f"rows={rows}", "-v", "live=0", "-f", str(ROOT / "scripts/fill_history.sql")]
    subprocess.run([*psql, "-d", database, *fill], check=True, stdout=subprocess.DEVNULL)
    with connection.cursor() as cursor:
        cursor.execute(ALL_FAILED)
        cursor.execute("ANALYZE django_sqltasks_taskrecord")
    print(f"filled {rows:,} FAILED tasks in {time.monotonic() - started:.1f} s")
    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "x")
    client = Client()
    client.force_login(user)
    url = f"{reverse('admin:django_sqltasks_taskrecord_changelist')}?status__exact=FAILED"
    data = {"action": "retry_tasks", "index": "0", "select_across": "1", "_selected_action": "x"}
    started = time.monotonic()
    page = client.post(url, data).content.decode()
    confirm_s = time.monotonic() - started
    count = re.search(r"these will be retried: (.+?) task", page)
    print(f"confirmation page: {confirm_s * 1000:.0f} ms, stating {count and count.group(1)}")
    data.update(dict(re.findall(r'name="(sqltasks_\w+)" value="([^"]*)"', page)))
    started = time.monotonic()
    client.post(url, data)
    print(f"queueing request: {(time.monotonic() - started) * 1000:.0f} ms")
    job = TaskRecord.objects.get(task_path="django_sqltasks.admin.bulk_jobs.bulk_job")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "django", "tasks_worker", "--burst", "--queue", "default"],
        env=env,
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    elapsed = time.monotonic() - started
    job.refresh_from_db()
    print(f"job {job.status}: {job.return_value}")
    ready = TaskRecord.objects.filter(status="READY", queue_name="other").count()
    print(f"worker run: {elapsed:.1f} s, {ready:,} tasks READY ({ready / elapsed:,.0f}/s)")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
