"""The fleet profile's probes: an idle window, then one task at a time against an idle fleet.

Over the idle window it counts the claims the workers make with nothing enqueued (their polls);
then it enqueues ``--probes`` tasks, each after the last one's report and a random gap, and
counts the claims made meanwhile. Claims beyond the idle rate, per probe, are the workers one
enqueue woke. It writes its figures as JSON to ``--figures``.
Usage: ``python -m benchmarks.fleet.probes --url URL --probes 40 --figures PATH``
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.mixed import app

REPORT_TIMEOUT = 30.0  # seconds a probe's report may take before the probe counts as lost
CLAIMS = """
SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
AND query LIKE %s
"""
CLAIM_MATCH = "%SKIP LOCKED%"  # django-sqltasks' claim statements (as benchmarks/mixed/)


def claims(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(CLAIMS, (CLAIM_MATCH,)).fetchone()
    return int(row[0]) if row else 0


def run(url: str, probes: int, idle: float, gap: float) -> dict[str, Any]:
    import django

    django.setup()
    from benchmarks.projects.tasks import touch

    reports = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    reports.bind(("127.0.0.1", 0))
    reports.settimeout(REPORT_TIMEOUT)
    port = reports.getsockname()[1]
    with psycopg.connect(url, autocommit=True, application_name="fleet-harness") as conn:
        touch.enqueue(-1, time.time(), port, 1)  # a warm-up: the enqueuer's connection is up
        reports.recv(64)
        time.sleep(gap)
        before, at = claims(conn), time.monotonic()
        time.sleep(idle)
        idle_claims, idle_s = claims(conn) - before, time.monotonic() - at
        latencies, lost = [], 0
        before, at = claims(conn), time.monotonic()
        for seq in range(probes):
            time.sleep(random.uniform(gap / 2, gap))
            touch.enqueue(seq, time.time(), port, seq + 1)
            try:
                while True:
                    got, enqueued_at, started, _ = app.TASK_EVENT.unpack(reports.recv(64))
                    if got == seq:
                        latencies.append(started - enqueued_at)
                        break
            except TimeoutError:
                lost += 1
        probe_claims, probe_s = claims(conn) - before, time.monotonic() - at
    idle_rate = idle_claims / idle_s if idle_s else 0.0
    return {
        "idle_s": idle_s,
        "idle_claims": idle_claims,
        "idle_claims_per_s": idle_rate,
        "probes": probes,
        "lost": lost,
        "probe_s": probe_s,
        "probe_claims": probe_claims,
        # The claims an enqueue caused: those of the probe phase beyond the idle polls.
        "claims_per_probe": max(0.0, probe_claims - idle_rate * probe_s) / probes,
        "latencies": latencies,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet.probes")
    parser.add_argument("--url", required=True, help="the server, direct (libpq URL)")
    parser.add_argument("--probes", type=int, required=True)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of the idle window")
    parser.add_argument("--gap", type=float, default=0.6, help="most seconds between probes")
    parser.add_argument("--figures", type=Path, required=True)
    args = parser.parse_args(argv)
    figures = run(args.url, args.probes, args.idle, args.gap)
    args.figures.write_text(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
