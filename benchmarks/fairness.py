"""Fairness (django-sqltasks only): one key with a big backlog, many other keys with a few tasks
each, two worker processes. How long until every task of the other keys has finished, with
``@task(fair_key=...)`` (keys taken round robin) and without (arrival order: behind the
backlog), and how much of the backlog ran meanwhile.

The harness side is ``run``; ``python -m benchmarks.fairness enqueue`` is the client that
writes the backlog (the big key's tasks first, then the others'), with the system's settings.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from typing import Any

from benchmarks import services
from benchmarks.processes import run_client, spawn, stop
from benchmarks.systems.base import System, django_env

ADDRESS_ENV = "BENCH_FAIRNESS_ADDR"  # where the other keys' tasks report to (the harness)
BIG = "big"  # the key of the backlog
OTHER_KEYS = 50  # keys besides the big one
EACH = 10  # tasks of each other key
WORKERS = 2  # worker processes
MODES = ("fair", "plain")  # with fair_key, and the same tasks without it (arrival order)
ENQUEUE_CHUNK = 10_000  # tasks a call of enqueue_many
CLIENT_TIMEOUT = 1800.0  # seconds


def supports(system: System) -> bool:
    return system.package == "django-sqltasks"


def run(system: System, n: int, ctx: Any) -> dict[str, Any]:
    """``n`` waiting tasks of the big key and OTHER_KEYS x EACH of others, for each mode."""
    record: dict[str, Any] = {"tasks": n, "other_tasks": OTHER_KEYS * EACH, "workers": WORKERS}
    for mode in MODES:
        measured = _run_mode(system, n, ctx, mode)
        record.update({f"{mode}_{key}": value for key, value in measured.items()})
    return record


def _run_mode(system: System, n: int, ctx: Any, mode: str) -> dict[str, Any]:
    services.reset(system, ctx.admin)
    env = django_env(system, ctx.endpoints)
    _client(env, "enqueue", "--mode", mode, "-n", str(n))
    expected = OTHER_KEYS * EACH
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        listener.bind(("127.0.0.1", 0))
        host, port = listener.getsockname()
        env[ADDRESS_ENV] = f"{host}:{port}"
        started = time.time()
        workers = [
            spawn(system.worker_argv(ctx.concurrency), env, ctx.log(system, f"fair-{mode}-{i}"))
            for i in range(WORKERS)
        ]
        done: list[float] = []
        deadline = time.monotonic() + 120.0 + n * 0.010
        try:
            while len(done) < expected:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or any(w.poll() is not None for w in workers):
                    raise RuntimeError(f"{mode}: {len(done)} of {expected} other-key tasks ran")
                listener.settimeout(min(remaining, 0.5))
                try:
                    event = json.loads(listener.recv(4096))
                except TimeoutError:
                    continue
                done.append(event["t"] - started)
        finally:
            for worker in workers:
                stop(worker)
    done.sort()
    return {
        "others_done_s": done[-1],
        "others_p50_s": done[len(done) // 2],
        "big_done_by_then": _client(env, "count")["big_done_by_then"],
    }


def _client(env: dict[str, str], *args: str) -> dict[str, Any]:
    """Run ``python -m benchmarks.fairness ARGS`` with the system's settings; its JSON."""
    return run_client("benchmarks.fairness", env, *args, timeout=CLIENT_TIMEOUT)


def count() -> dict[str, Any]:
    """How many tasks of the big key had finished when the last of the others did (by the
    finished_at the workers wrote)."""
    import django

    django.setup()
    from django.db.models import Max

    from django_sqltasks.models import TaskRecord

    others = TaskRecord.objects.exclude(args__0=BIG).filter(status="SUCCESSFUL")
    last = others.aggregate(last=Max("finished_at"))["last"]
    big = TaskRecord.objects.filter(args__0=BIG, status="SUCCESSFUL", finished_at__lte=last)
    return {"big_done_by_then": big.count()}


def enqueue(mode: str, n: int) -> dict[str, Any]:
    """The big key's ``n`` tasks, then EACH tasks of each other key, in enqueue_many calls."""
    import django

    django.setup()
    from benchmarks.projects.fairness import fair_noop, plain_noop

    task = fair_noop if mode == "fair" else plain_noop
    backend = task.get_backend()
    started = time.perf_counter()
    for start in range(0, n, ENQUEUE_CHUNK):
        count = min(ENQUEUE_CHUNK, n - start)
        backend.enqueue_many(task, [((BIG,), {})] * count)  # type: ignore[attr-defined]
    others = [((f"key{k:02d}",), {}) for _ in range(EACH) for k in range(OTHER_KEYS)]
    backend.enqueue_many(task, others)  # type: ignore[attr-defined]
    return {"seconds": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fairness")
    sub = parser.add_subparsers(dest="command", required=True)
    enq = sub.add_parser("enqueue")
    enq.add_argument("--mode", choices=MODES, required=True)
    enq.add_argument("-n", type=int, required=True)
    sub.add_parser("count")
    args = parser.parse_args(argv)
    result = enqueue(args.mode, args.n) if args.command == "enqueue" else count()
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
