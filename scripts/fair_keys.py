"""Fair queues with many keys: one worker drains N tasks of N distinct fair keys (and the same
tasks without fair_key, for comparison); a few seconds in, tasks of new keys are enqueued
(one that sorts before every key, one after), and we time how long each waits to start.

Out of CI; see docs/fair-queues.md. On the database of ``DATABASE_URL`` (its task table is
emptied first):

    DATABASE_URL=postgres://postgres@127.0.0.1/fair .venv/bin/python scripts/fair_keys.py

``--root`` runs the worker from another checkout (to measure an older commit the same way).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHUNK = 10_000  # tasks a call of enqueue_many
WINDOW = 20.0  # seconds of draining the rate is measured over
NEW_KEYS_AFTER = 5.0  # seconds into the window the new keys' tasks are enqueued


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def drain(root: Path, env: dict[str, str], logdir: Path, mode: str, keys: int) -> dict[str, Any]:
    from django.db import connection

    from django_sqltasks.compat import task_backends
    from django_sqltasks.models import TaskRecord
    from tests import tasks_fair

    TaskRecord.objects.all().delete()
    task = tasks_fair.per_tenant if mode == "fair" else tasks_fair.unfair
    backend: Any = task_backends["default"]
    began = time.monotonic()
    for first in range(0, keys, CHUNK):
        calls: list[tuple[tuple[str, ...], dict[str, Any]]] = [
            (("/dev/null", f"k{i:07d}", "x"), {}) for i in range(first, first + CHUNK)
        ]
        backend.enqueue_many(task, calls)
    log(f"{mode}: enqueued {keys:,} tasks of {keys:,} keys in {time.monotonic() - began:.1f}s")
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("VACUUM ANALYZE django_sqltasks_taskrecord")
    out = (logdir / f"{mode}.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "django", "tasks_worker", "--concurrency", "50"],
        cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
    )  # fmt: skip
    done = TaskRecord.objects.filter(status="SUCCESSFUL")
    while not done.exists():
        time.sleep(0.05)
    start = time.monotonic()
    counted = done.count()
    new: list[str] = []
    while time.monotonic() - start < WINDOW:
        if not new and time.monotonic() - start >= NEW_KEYS_AFTER:
            new = [task.enqueue("/dev/null", key, "new").id for key in ("a-new", "z-new")]
        time.sleep(0.1)
    rate = (done.count() - counted) / (time.monotonic() - start)
    waits: dict[str, float | None] = {}
    deadline = time.monotonic() + 300
    for task_id, key in zip(new, ("a-new", "z-new"), strict=True):
        row = TaskRecord.objects.get(id=task_id)
        while row.started_at is None and time.monotonic() < deadline:
            time.sleep(0.2)
            row.refresh_from_db()
        waits[key] = (
            None if row.started_at is None else (row.started_at - row.enqueued_at).total_seconds()
        )
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)
    figures = {"tasks_per_s": round(rate), "new_key_wait_s": waits}
    log(f"{mode}: {figures}")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout the worker runs")
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--modes", default="fair,plain")
    parser.add_argument("--json", type=Path, help="write the figures here")
    options = parser.parse_args()
    root = options.root.resolve()
    sys.path.insert(0, str(root))
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["SQLTASKS_POLL_INTERVAL"] = "1"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    env = {**os.environ, "PYTHONPATH": str(root)}
    logdir = Path(tempfile.mkdtemp(prefix="fair-keys-"))
    figures = {
        mode: drain(root, env, logdir, mode, options.keys) for mode in options.modes.split(",")
    }
    print(json.dumps(figures, indent=2))
    if options.json:
        options.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
