"""The heartbeat beside a large table of periodic schedules, with a real worker process.

Out of CI; see docs/schedules.md. It fills the schedule table of the database ``DATABASE_URL``
names (the test settings' project; migrated first, its task and schedule tables emptied) with
``--schedules`` cron schedules of ``tests.tasks.tick``, ``"M * * * *"`` with M = i mod 60 (so a
sixtieth of them is due each minute, each once an hour), starts ``manage.py tasks_worker`` with
the default HEARTBEAT_INTERVAL (5 s) and LEASE_TIMEOUT (30 s), and for ``--seconds`` reads the
age of its heartbeat by the database's clock every 0.25 s. Then it stops the worker and counts
the tasks the schedules enqueued: none may be enqueued twice for one slot (each schedule fires at
most once in a run under an hour) and none may have run twice (attempts 1, no rescue).

``--seen`` stores each schedule's last and next run as a worker would have (a table in steady
state); without it, the worker sees every schedule for the first time, and stores them.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/sqltasks_bench \\
        .venv/bin/python scripts/schedule_heartbeat.py --schedules 300000 --seconds 240 --seen
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK = "tests.tasks.tick"
CHUNK = 10_000  # schedules per INSERT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=300_000)
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--seen", action="store_true", help="store each schedule's runs first")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django  # after the path and settings are set

    django.setup()
    from django.core.management import call_command  # needs the settings set up
    from django.db import connection

    from django_sqltasks.models import ScheduleRecord, TaskRecord, WorkerRecord
    from django_sqltasks.store.control import database_now

    call_command("migrate", verbosity=0)
    TaskRecord.objects.all().delete()
    ScheduleRecord.objects.all().delete()
    WorkerRecord.objects.all().delete()
    now = database_now("default")
    hour = now.replace(minute=0, second=0, microsecond=0)
    started = time.monotonic()
    for first in range(0, args.schedules, CHUNK):
        rows = []
        for i in range(first, min(first + CHUNK, args.schedules)):
            minute = i % 60
            fields = {}
            if args.seen:  # as a worker leaves a schedule: its last slot, its next run
                slot = hour + timedelta(minutes=minute)
                last = slot if slot <= now else slot - timedelta(hours=1)
                fields = {"last_slot": last, "next_run_at": last + timedelta(hours=1)}
            rows.append(
                ScheduleRecord(
                    backend_name="default",
                    name=f"s{i:07}",
                    task_path=TICK,
                    kwargs={"label": f"s{i:07}"},
                    cron=f"{minute} * * * *",
                    time_zone="UTC",
                    **fields,
                )
            )
        ScheduleRecord.objects.bulk_create(rows)
    print(f"{args.schedules} schedules stored in {time.monotonic() - started:.0f}s", flush=True)

    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "django", "tasks_worker", "-c", "10"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ages: list[float] = []
    first_seen_at = None
    began = time.monotonic()
    try:
        while time.monotonic() - began < args.seconds:
            time.sleep(0.25)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT {_age_sql(connection.vendor)} FROM django_sqltasks_workerrecord"
                )
                row = cursor.fetchone()
            if row is not None and row[0] is not None:
                ages.append(float(row[0]))
            if (
                first_seen_at is None
                and ages
                and not ScheduleRecord.objects.filter(next_run_at__isnull=True).exists()
            ):
                first_seen_at = time.monotonic() - began
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=120)

    ticks = TaskRecord.objects.filter(task_path=TICK)
    labels = ticks.values_list("kwargs", flat=True)
    counted: dict[str, int] = {}
    for kwargs in labels:
        counted[kwargs["label"]] = counted.get(kwargs["label"], 0) + 1
    figures = {
        "schedules": args.schedules,
        "seen_before": args.seen,
        "seconds": args.seconds,
        "heartbeat_samples": len(ages),
        "heartbeat_age_max_s": round(max(ages, default=float("nan")), 2),
        "heartbeat_age_p99_s": round(sorted(ages)[int(len(ages) * 0.99)] if ages else 0, 2),
        "all_seen_after_s": None if first_seen_at is None else round(first_seen_at, 1),
        "tasks_enqueued": ticks.count(),
        "tasks_finished": ticks.filter(status="SUCCESSFUL").count(),
        "schedules_enqueued_twice": sum(1 for n in counted.values() if n > 1),
        "tasks_run_twice": ticks.filter(attempts__gt=1).count()
        + ticks.filter(rescues__gt=0).count(),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


def _age_sql(vendor: str) -> str:
    """The age of the heartbeat in seconds, by the database's clock."""
    if vendor == "postgresql":
        return "EXTRACT(EPOCH FROM (now() - heartbeat_at))"
    if vendor == "mysql":
        return "TIMESTAMPDIFF(MICROSECOND, heartbeat_at, UTC_TIMESTAMP(6)) / 1e6"
    return "(julianday('now') - julianday(heartbeat_at)) * 86400"


if __name__ == "__main__":
    main()
