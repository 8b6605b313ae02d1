"""What a crash costs the worker that survives it: a busy worker of 10 slots is killed with 50
tasks in flight (10 running, 40 prefetched); they become suspects once its lease runs out. We
watch the surviving worker (10 slots, busy with a backlog) from the kill until the 50 have run:
how many of its slots run tasks, and how long fresh tasks (a probe enqueued every second, at a
priority above the backlog) wait to start.

Out of CI; see docs/reliability.md. On the database of ``DATABASE_URL`` (its task table is
emptied first):

    DATABASE_URL=postgres://postgres@127.0.0.1/crash .venv/bin/python scripts/crash_cost.py

``--root`` runs the workers from another checkout (to measure an older commit the same way).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

TASK_SECONDS = 2.0  # every task of the run sleeps this long
IN_FLIGHT = 50  # the victim's tasks when it dies: --concurrency 10 --prefetch 40
SAMPLE_EVERY = 0.2  # seconds between two counts of the survivor's running tasks


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def start_worker(root: Path, env: dict[str, str], logdir: Path, *args: str) -> Any:
    out = (logdir / f"{args[1]}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "django", "tasks_worker", *args],
        cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout the workers run")
    parser.add_argument("--lease", type=float, default=5.0, help="LEASE_TIMEOUT, seconds")
    parser.add_argument("--backlog", type=int, default=600, help="the survivor's fresh tasks")
    parser.add_argument("--json", type=Path, help="write the figures here")
    options = parser.parse_args()
    root = options.root.resolve()
    sys.path.insert(0, str(root))
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["SQLTASKS_LEASE_TIMEOUT"] = str(options.lease)
    os.environ["SQLTASKS_HEARTBEAT_INTERVAL"] = str(options.lease / 5)
    os.environ["SQLTASKS_POLL_INTERVAL"] = "1"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from django_sqltasks.models import TaskRecord, WorkerRecord
    from tests import tasks

    call_command("migrate", verbosity=0)
    TaskRecord.objects.all().delete()
    WorkerRecord.objects.all().delete()
    env = {**os.environ, "PYTHONPATH": str(root)}
    logdir = Path(tempfile.mkdtemp(prefix="crash-cost-"))

    backlog = tasks.sleep.using(queue_name="default")
    for _ in range(options.backlog):
        backlog.enqueue(TASK_SECONDS)
    # The victim's 50, in a queue of their own so that the survivor takes none before the kill.
    victims = [tasks.sleep.using(queue_name="other").enqueue(TASK_SECONDS).id for _ in range(50)]
    victim = start_worker(
        root, env, logdir, "--worker-id", "victim", "--queue", "other",
        "--concurrency", "10", "--prefetch", str(IN_FLIGHT - 10),
    )  # fmt: skip
    while TaskRecord.objects.filter(owner="victim", status="RUNNING").count() < IN_FLIGHT:
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed = time.monotonic()
    log(f"killed the victim with {IN_FLIGHT} tasks in flight; lease {options.lease:g}s")
    survivor = start_worker(
        root, env, logdir, "--worker-id", "survivor", "--queue", "default,other",
        "--concurrency", "10", "--prefetch", "0",
    )  # fmt: skip

    probe = tasks.sleep.using(queue_name="default", priority=10)
    probes: list[str] = []
    samples: list[tuple[float, int]] = []
    next_probe = killed
    rescued_at: float | None = None
    while True:
        now = time.monotonic()
        if now >= next_probe:
            probes.append(probe.enqueue(0.0).id)
            next_probe += 1.0
        running = TaskRecord.objects.filter(owner="survivor", status="RUNNING").count()
        samples.append((now - killed, running))
        if rescued_at is None and not TaskRecord.objects.filter(owner="victim").exists():
            rescued_at = now - killed
        done = TaskRecord.objects.filter(id__in=victims, status="SUCCESSFUL").count()
        if done == len(victims) or now - killed > 600:
            break
        time.sleep(SAMPLE_EVERY)
    drained = time.monotonic() - killed
    log(f"the victim's {done} tasks done {drained:.1f}s after the kill")
    survivor.send_signal(signal.SIGTERM)
    survivor.wait(timeout=60)

    waits = []
    for row in TaskRecord.objects.filter(id__in=probes).exclude(started_at=None):
        assert row.started_at is not None
        waits.append((row.started_at - row.enqueued_at).total_seconds())
    unstarted = len(probes) - len(waits)
    window = [n for t, n in samples if rescued_at is not None and t >= rescued_at]
    victims_rows = TaskRecord.objects.filter(id__in=victims)
    figures = {
        "lease_timeout_s": options.lease,
        "rescued_after_s": round(rescued_at or -1, 2),
        "victims_done_after_s": round(drained, 2),
        "victims_successful": victims_rows.filter(status="SUCCESSFUL").count(),
        "victims_rescues": sum(victims_rows.values_list("rescues", flat=True)),
        "survivor_running_after_rescue": {
            "samples": len(window),
            "min": min(window, default=0),
            "median": statistics.median(window) if window else 0,
            "share_at_least_8": round(sum(n >= 8 for n in window) / max(1, len(window)), 3),
        },
        "probe_wait_s": {
            "probes": len(probes),
            "not_started": unstarted,
            "median": round(statistics.median(waits), 3) if waits else None,
            "max": round(max(waits), 3) if waits else None,
        },
        "database": connection.vendor,
        "at": timezone.now().isoformat(),
    }
    print(json.dumps(figures, indent=2))
    if options.json:
        options.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
