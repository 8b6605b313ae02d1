"""The steady arrivals: one task every 1/rate seconds, one enqueue call at a time (autocommit, as
a view makes them), for django-sqltasks (``touch.enqueue``) or the classic table (one INSERT).

An enqueue that falls behind the schedule catches up at once, and the figures say how far behind
it fell. At the end it writes every task's enqueue time (seconds since the epoch, in order of
``seq``) to ``--times`` as float64s and its figures as JSON to ``--figures``.
Usage: ``python -m benchmarks.mixed.enqueuer --system classic --url URL --rate 120 ...``
"""

from __future__ import annotations

import argparse
import array
import json
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.mixed import app

Enqueue = Callable[[int, float, int, int], None]


def sqltasks_enqueue() -> Enqueue:
    import django

    django.setup()
    from benchmarks.projects.tasks import touch

    def enqueue(seq: int, enqueued_at: float, port: int, account: int) -> None:
        touch.enqueue(seq, enqueued_at, port, account)

    return enqueue


def classic_enqueue(url: str) -> Enqueue:
    import psycopg

    from benchmarks.mixed import classic

    cursor = psycopg.connect(url, autocommit=True, application_name="enqueuer").cursor()
    return lambda *args: classic.enqueue(cursor, *args)


def run(enqueue: Enqueue, rate: float, seconds: float, port: int, accounts: int) -> dict[str, Any]:
    stopping = [False]
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.__setitem__(0, True))
    reports = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    times = array.array("d")
    reports.sendto(app.PROGRESS_EVENT.pack(0, time.time(), 0.0), ("127.0.0.1", port))
    started = time.monotonic()
    next_report = started + app.PROGRESS_EVERY
    slowest = slowest_overall = 0.0
    behind = 0
    seq = 0
    while not stopping[0]:
        now = time.monotonic()
        if now - started >= seconds:
            break
        due = int((now - started) * rate) + 1  # tasks the schedule has asked for by now
        if seq >= due:
            time.sleep(min(seq / rate - (now - started), app.PROGRESS_EVERY))
        else:
            behind = max(behind, due - seq - 1)
            at = time.time()
            enqueue(seq, at, port, seq % accounts + 1)
            took = time.time() - at
            slowest, slowest_overall = max(slowest, took), max(slowest_overall, took)
            times.append(at)
            seq += 1
        if time.monotonic() >= next_report:
            reports.sendto(app.PROGRESS_EVENT.pack(seq, time.time(), slowest), ("127.0.0.1", port))
            slowest = 0.0
            next_report += app.PROGRESS_EVERY
    elapsed = time.monotonic() - started
    return {
        "enqueued": seq,
        "seconds": elapsed,
        "rate": seq / elapsed if elapsed else 0.0,
        "most_behind_tasks": behind,
        "slowest_enqueue_ms": slowest_overall * 1000,
        "times": times,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mixed.enqueuer")
    parser.add_argument("--system", choices=("sqltasks", "classic"), required=True)
    parser.add_argument("--url", help="the classic table's database (libpq URL)")
    parser.add_argument("--rate", type=float, required=True, help="tasks per second")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--port", type=int, required=True, help="the harness's UDP port")
    parser.add_argument("--accounts", type=int, required=True, help="rows of the app's table")
    parser.add_argument("--times", type=Path, required=True)
    parser.add_argument("--figures", type=Path, required=True)
    args = parser.parse_args(argv)
    enqueue = sqltasks_enqueue() if args.system == "sqltasks" else classic_enqueue(args.url)
    figures = run(enqueue, args.rate, args.seconds, args.port, args.accounts)
    args.times.write_bytes(figures.pop("times").tobytes())
    args.figures.write_text(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
