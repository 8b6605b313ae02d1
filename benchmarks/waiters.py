"""Waiting for results (django-sqltasks only): how soon ``result.wait()`` returns once its task
has ended, and what a crowd of waiting requests costs the database.

``latency``: PROBES tasks, one at a time, each enqueued and waited on with ``result.wait()``
while a worker process runs them; the time from the task's end (the ``finished_at`` its worker
wrote in the row; worker, client and database share one machine's clock) to the wait's return.

``crowd``: CROWD async waits (``await result.await_result()``), one per task, on one event loop,
with no worker running, for CROWD_SECONDS: the database sessions the client process holds
beyond the one it had (the server's count; SQLite has none to count), and the queries per
second the process sends once every wait has settled: the watcher's (on PostgreSQL only a
safety sweep every 5 s; elsewhere one batched poll per 500 ms and per 500 waits) and the waits'
own reads (none while they sleep), counted in the client.

The harness side is ``run``; ``python -m benchmarks.waiters latency|crowd`` is the client, with
the system's settings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from typing import Any

from benchmarks import services
from benchmarks.metrics import percentile
from benchmarks.processes import run_client, spawn, stop
from benchmarks.systems.base import System, django_env

PROBES = 200  # waits timed, one at a time
WARM_UP = 3  # waits first, not timed: the watcher starts, and its connection opens
CROWD = 1000  # concurrent async waits
CROWD_SECONDS = 20.0  # how long each waits (then times out)
SETTLE_SECONDS = 3.0  # from the crowd's start to the measured window (polls back off by then)
CLIENT_TIMEOUT = 600.0  # seconds


def supports(system: System) -> bool:
    return system.package == "django-sqltasks"


def run(system: System, n: int, ctx: Any) -> dict[str, Any]:
    """The latency probes against an idle worker, then the crowd with no worker."""
    services.reset(system, ctx.admin)
    env = django_env(system, ctx.endpoints)
    worker = spawn(system.worker_argv(ctx.concurrency), env, ctx.log(system, "waiters"))
    try:
        record = _client(env, "latency", "--probes", str(PROBES))
    finally:
        stop(worker)
    services.reset(system, ctx.admin)
    record.update(_client(env, "crowd", "-n", str(CROWD), "--seconds", str(CROWD_SECONDS)))
    return record


def _client(env: dict[str, str], *args: str) -> dict[str, Any]:
    """Run ``python -m benchmarks.waiters ARGS`` with the system's settings; its JSON."""
    return run_client("benchmarks.waiters", env, *args, timeout=CLIENT_TIMEOUT)


def latency(probes: int) -> dict[str, Any]:
    """Enqueue a task and wait for it, ``probes`` times: from its end to the wait's return."""
    import django

    django.setup()
    from benchmarks.projects.tasks import noop

    seconds = []
    for i in range(WARM_UP + probes):
        result = noop.enqueue()
        result.wait(timeout=60)  # type: ignore[attr-defined]
        returned = time.time()
        if i >= WARM_UP:
            seconds.append(returned - result.finished_at.timestamp())  # type: ignore[union-attr]
    return {
        "wait_probes": probes,
        "wait_p50_ms": percentile(seconds, 50) * 1000,
        "wait_p95_ms": percentile(seconds, 95) * 1000,
        "wait_max_ms": max(seconds) * 1000,
    }


def crowd(n: int, seconds: float) -> dict[str, Any]:
    """``n`` async waits for ``seconds`` on tasks no worker runs: sessions and queries/s."""
    import django

    django.setup()
    from django.db import connection

    from benchmarks.projects.tasks import noop
    from django_sqltasks.backend import SQLTaskBackend
    from django_sqltasks.sql.tasks import TaskStatements
    from django_sqltasks.store import finished

    queries = _count_calls(TaskStatements, "finished_among")
    reads = _count_calls(SQLTaskBackend, "aget_result")
    results = noop.get_backend().enqueue_many(noop, [((), {})] * n)  # type: ignore[attr-defined]
    measured: dict[str, Any] = {}
    before = _in_thread(lambda: _sessions(connection))  # as the measuring thread counts below

    def measure() -> None:
        """On a thread of its own, while the loop below waits."""
        while (
            finished.watcher_for(connection.alias, listen=False).waiting
            + _listening(finished, connection.alias)
            < n
        ):
            time.sleep(0.01)
        time.sleep(SETTLE_SECONDS)
        q0, r0, t0 = queries[0], reads[0], time.monotonic()
        measured["sessions"] = _sessions(connection)
        time.sleep(max(1.0, started[0] + seconds - 1.0 - time.monotonic()))  # before any ends
        q1, r1, t1 = queries[0], reads[0], time.monotonic()
        measured["queries_per_s"] = (q1 - q0) / (t1 - t0)
        measured["reads_per_s"] = (r1 - r0) / (t1 - t0)
        connection.close()

    async def wait_all() -> list[Any]:
        waits = [r.await_result(timeout=seconds) for r in results]  # type: ignore[attr-defined]
        return await asyncio.gather(*waits, return_exceptions=True)

    started = [time.monotonic()]
    thread = threading.Thread(target=measure)
    thread.start()
    outcomes = asyncio.run(wait_all())
    elapsed = time.monotonic() - started[0]
    thread.join()
    timed_out = sum(isinstance(o, TimeoutError) for o in outcomes)
    record = {
        "crowd_waiters": n,
        "crowd_timed_out": timed_out,
        "crowd_seconds": elapsed,
        "crowd_queries_per_s": measured.get("queries_per_s"),
        "crowd_reads_per_s": measured.get("reads_per_s"),
    }
    if before is not None and measured.get("sessions") is not None:
        # Both counts include this process's main session and the counting thread's own.
        record["crowd_sessions"] = measured["sessions"] - before
    return record


def _in_thread(fn: Any) -> Any:
    """``fn()`` on a thread of its own, which closes its connections after."""
    from django.db import connections

    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out[0] if out else None


def _listening(finished: Any, alias: str) -> int:
    return int(finished.watcher_for(alias, listen=True).waiting)


def _count_calls(cls: type, name: str) -> list[int]:
    """Count calls of ``cls.name`` and of every override of it, from any thread."""
    count = [0]
    lock = threading.Lock()
    for klass in [cls, *_subclasses(cls)]:
        if name not in vars(klass):
            continue
        original = vars(klass)[name]

        def counted(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            with lock:
                count[0] += 1
            return _original(*args, **kwargs)

        setattr(klass, name, counted)
    return count


def _subclasses(cls: type) -> list[type]:
    from django_sqltasks.sql import mysql, postgresql, sqlite  # noqa: F401  (load them all)

    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _sessions(connection: Any) -> int | None:
    """Sessions open on this database, by the server's count; None on SQLite."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            )
        elif connection.vendor == "mysql":
            cursor.execute(
                "SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE()"
            )
        else:
            return None
        return int(cursor.fetchone()[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.waiters")
    sub = parser.add_subparsers(dest="command", required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("--probes", type=int, default=PROBES)
    crd = sub.add_parser("crowd")
    crd.add_argument("-n", type=int, default=CROWD)
    crd.add_argument("--seconds", type=float, default=CROWD_SECONDS)
    args = parser.parse_args(argv)
    result = latency(args.probes) if args.command == "latency" else crowd(args.n, args.seconds)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
