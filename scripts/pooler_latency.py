"""Enqueue-to-start latency behind PgBouncer in transaction mode: workers that poll (NOTIFY off,
as without LISTEN_DATABASE) against workers whose LISTEN goes straight to the server
(LISTEN_DATABASE), every enqueue, outcome and other query going through PgBouncer.

Out of CI; see docs/databases.md ("Behind PgBouncer"). It starts its own PgBouncer (tests/
pgbouncer.py) in front of the server DATABASE_URL names, and for each set-up one real
``tasks_worker`` process through it; this process enqueues one ``probe_latency`` task at a
time through PgBouncer, at random gaps, and takes the task's start time (``time.time()``,
which it sends back over UDP) minus the time just before the ``enqueue()`` call:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/scratch \\
        .venv/bin/python scripts/pooler_latency.py --probes 200

The task table of that database is emptied first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUPS = {
    # POLL_INTERVAL is the default (1 s) in both.
    "poll": {"SQLTASKS_NOTIFY": "0"},
    "listen_database": {"SQLTASKS_TEST_LISTEN_DATABASE": "direct"},
    # NOTIFY on, LISTEN through PgBouncer: what the docs warn against (not run by default).
    "listen_through_pooler": {},
}
DEFAULT_SETUPS = "poll,listen_database"
# Seconds between a task's start and the next enqueue, drawn at random: the worker is idle when
# each task comes. Steady traffic (the default) keeps a polling worker on its short polls after
# work (10 ms, doubling); sparse traffic (--gap 1.5,3) lets it reach POLL_INTERVAL.
GAP = "0.05,0.25"
READY_LINE = "Worker started"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--setups", default=DEFAULT_SETUPS)
    parser.add_argument("--gap", default=GAP, help="MIN,MAX seconds between probes")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import dj_database_url

    from tests.pgbouncer import PgBouncer, find_pgbouncer

    binary = find_pgbouncer()
    if binary is None:
        sys.exit("pgbouncer is not installed (apt-get install pgbouncer)")
    server = dj_database_url.parse(os.environ["DATABASE_URL"])
    bouncer = PgBouncer(binary, server).start()
    try:
        # This process's Django goes through PgBouncer too: its enqueues and their NOTIFY.
        os.environ["SQLTASKS_TEST_POOLER_PORT"] = str(bouncer.port)
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connections

        from django_sqltasks.models import TaskRecord
        from tests import tasks

        call_command("migrate", verbosity=0, database="direct")
        for name in args.setups.split(","):
            TaskRecord.objects.all().delete()
            connections.close_all()
            low, high = (float(x) for x in args.gap.split(","))
            figures = _measure(
                tasks.probe_latency, bouncer.port, SETUPS[name], args.probes, (low, high)
            )
            print(json.dumps({"setup": name, "gap": args.gap, **figures}), flush=True)
    finally:
        bouncer.stop()


def _measure(
    task: object, pooler_port: int, env: dict[str, str], probes: int, gap: tuple[float, float]
) -> dict[str, float]:
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock,
        tempfile.NamedTemporaryFile("w+", prefix="pooler-worker-", suffix=".log") as log,
    ):
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(30)
        port = sock.getsockname()[1]
        worker = subprocess.Popen(
            [sys.executable, "-m", "django", "tasks_worker", "--concurrency", "4"],
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "SQLTASKS_TEST_POOLER_PORT": str(pooler_port),
                "SQLTASKS_POLL_INTERVAL": "1",
                **env,
            },
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_for_line(log.name, READY_LINE, worker)
            latencies = []
            for _ in range(probes):
                time.sleep(random.uniform(*gap))  # the worker is idle when the task comes
                sent = time.time()
                task.enqueue(port)  # type: ignore[attr-defined]
                started = float(sock.recv(64).decode())
                latencies.append((started - sent) * 1000)
        finally:
            worker.terminate()
            worker.wait(timeout=30)
    latencies.sort()
    return {
        "probes": probes,
        "p50_ms": round(statistics.median(latencies), 1),
        "p90_ms": round(latencies[int(len(latencies) * 0.90) - 1], 1),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1], 1),
        "max_ms": round(latencies[-1], 1),
    }


def _wait_for_line(path: str, line: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while line not in Path(path).read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"the worker did not start:\n{Path(path).read_text(errors='replace')}")
        time.sleep(0.05)


if __name__ == "__main__":
    main()
