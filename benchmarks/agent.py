"""Client-side subprocess: enqueue N tasks, or run the paced latency probes.

Runs with the system's Django settings (``BENCH_SYSTEM``) and prints one JSON object.
Usage: ``python -m benchmarks.agent enqueue --task noop -n 5000 --in-flight 200``
       ``python -m benchmarks.agent latency --probes 50``
       ``python -m benchmarks.agent bulk -n 5000``
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import random
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

WARMUP_TIMEOUT = 120.0  # seconds, covers worker start-up
PROBE_TIMEOUT = 10.0  # seconds
# Probes follow each other after a random gap, so they land at random phases of a polling
# worker's cycle (django-tasks-db and django-sqltasks poll every 1 s by default when idle).
PROBE_GAP_MIN = 0.0  # seconds
PROBE_GAP_MAX = 1.0  # seconds
# The busy variant: the next probe 2-5 ms after the last one started, so the enqueuer, the
# worker and the database are never idle long enough for a core to go to sleep.
BUSY_GAP_MIN = 0.002  # seconds
BUSY_GAP_MAX = 0.005  # seconds


async def run_bounded(n: int, in_flight: int, one: Callable[[int], Awaitable[None]]) -> float:
    """Call ``one(i)`` for i < n with at most ``in_flight`` awaits pending; return seconds taken."""
    counter = iter(range(n))

    async def lane() -> None:
        for i in counter:
            await one(i)

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(min(in_flight, n))))
    return time.perf_counter() - started


async def run_gathered(n: int, in_flight: int, one: Callable[[int], Awaitable[None]]) -> float:
    """Gather ``n`` coroutines, each waiting on an ``asyncio.Semaphore(in_flight)`` before it
    calls ``one(i)``: a common idiom, in which calls arrive in waves as the semaphore frees."""
    semaphore = asyncio.Semaphore(in_flight)

    async def guarded(i: int) -> None:
        async with semaphore:
            await one(i)

    started = time.perf_counter()
    await asyncio.gather(*(guarded(i) for i in range(n)))
    return time.perf_counter() - started


ARRIVALS = {"lanes": run_bounded, "semaphore": run_gathered}


def _django_enqueuer() -> tuple[Callable[..., Awaitable[None]], dict[str, Any]]:
    import django

    django.setup()
    from benchmarks.projects.enqueue import aenqueue
    from benchmarks.projects.tasks import TASKS

    return aenqueue, TASKS


async def enqueue(task_name: str, n: int, in_flight: int, arrival: str = "lanes") -> dict[str, Any]:
    from benchmarks.systems import current_system

    if current_system().enqueue_kind == "raw-sql":
        from benchmarks import rawsql

        seconds = await rawsql.enqueue_batches(task_name, n, in_flight)
    else:
        aenqueue, tasks = _django_enqueuer()
        task = tasks[task_name]
        seconds = await ARRIVALS[arrival](n, in_flight, lambda i: aenqueue(task))
    return {"enqueued": n, "seconds": seconds, "ops": n / seconds}


async def latency(
    probes: int, seed: int, gap: tuple[float, float] = (PROBE_GAP_MIN, PROBE_GAP_MAX)
) -> dict[str, Any]:
    """Enqueue one probe at a time, each a random ``gap`` (seconds) after the last one started,
    and record enqueue-to-start latency."""
    from benchmarks.systems import current_system

    if current_system().enqueue_kind == "raw-sql":
        from benchmarks import rawsql

        async def send(seq: int, at: float, port: int) -> None:
            await rawsql.enqueue_one("probe", [seq, at, port])
    elif current_system().enqueue_kind == "sql-floor":
        # Only the floor's agent needs its module and connection.
        floor = importlib.import_module(current_system().sql_module)

        async def send(seq: int, at: float, port: int) -> None:
            await floor.enqueue_one("probe", [seq, at, port])
    else:
        aenqueue, tasks = _django_enqueuer()

        async def send(seq: int, at: float, port: int) -> None:
            await aenqueue(tasks["probe"], seq, at, port)

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    port = sock.getsockname()[1]
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)

    async def one(seq: int, timeout: float) -> float:
        await send(seq, time.time(), port)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"probe {seq} did not start within {timeout}s")
            data = await asyncio.wait_for(loop.sock_recv(sock, 4096), remaining)
            event = json.loads(data)
            if event["seq"] == seq:
                return float(event["latency"])

    await one(-1, WARMUP_TIMEOUT)  # the worker is up and idle after this one
    latencies = []
    for seq in range(probes):
        # A random gap puts each probe at a random phase of a polling worker's cycle.
        await asyncio.sleep(rng.uniform(*gap))
        latencies.append(await one(seq, PROBE_TIMEOUT))
    sock.close()
    return {"latencies": latencies}


SINGLE_ENQUEUES = 1000  # sync enqueue() calls, one at a time, against as many ORM creates


async def bulk(n: int) -> dict[str, Any]:
    """Time one ``enqueue_many`` of ``n`` NoOp tasks, then one ``aenqueue_many`` of ``n``; and
    sync ``enqueue()`` one at a time against the plain ORM insert of the same row."""
    _, tasks = _django_enqueuer()
    from asgiref.sync import sync_to_async

    task = tasks["noop"]
    backend = task.get_backend()
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [((), {})] * n

    def timed_sync() -> float:
        backend.enqueue_many(task, calls[:10])  # connected, warmed up
        started = time.perf_counter()
        backend.enqueue_many(task, calls)
        return time.perf_counter() - started

    def timed_single() -> tuple[float, float]:
        from django.utils import timezone

        from django_sqltasks.models import TaskRecord

        started = time.perf_counter()
        for _ in range(SINGLE_ENQUEUES):
            task.enqueue()
        enqueue_seconds = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(SINGLE_ENQUEUES):
            now = timezone.now()
            TaskRecord.objects.create(
                task_path=task.module_path,
                backend_name=backend.alias,
                queue_name=task.queue_name,
                enqueued_at=now,
                available_at=now,
            )
        return enqueue_seconds, time.perf_counter() - started

    sync_seconds = await sync_to_async(timed_sync)()
    await backend.aenqueue_many(task, calls[:10])
    started = time.perf_counter()
    await backend.aenqueue_many(task, calls)
    async_seconds = time.perf_counter() - started
    enqueue_seconds, orm_seconds = await sync_to_async(timed_single)()
    return {
        "sync_seconds": sync_seconds,
        "async_seconds": async_seconds,
        "single_enqueues": SINGLE_ENQUEUES,
        "enqueue_seconds": enqueue_seconds,
        "orm_create_seconds": orm_seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agent")
    sub = parser.add_subparsers(dest="command", required=True)
    enq = sub.add_parser("enqueue")
    enq.add_argument("--task", choices=["noop", "sleep", "probe"], default="noop")
    enq.add_argument("-n", type=int, required=True)
    enq.add_argument("--in-flight", type=int, default=200)
    enq.add_argument("--arrival", choices=sorted(ARRIVALS), default="lanes")
    blk = sub.add_parser("bulk")
    blk.add_argument("-n", type=int, required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("--probes", type=int, default=50)
    lat.add_argument("--seed", type=int, default=0)
    lat.add_argument("--busy", action="store_true", help="a probe every 2-5 ms, not 0-1 s")
    args = parser.parse_args(argv)
    if args.command == "enqueue":
        result = asyncio.run(enqueue(args.task, args.n, args.in_flight, args.arrival))
    elif args.command == "bulk":
        result = asyncio.run(bulk(args.n))
    else:
        gap = (BUSY_GAP_MIN, BUSY_GAP_MAX) if args.busy else (PROBE_GAP_MIN, PROBE_GAP_MAX)
        result = asyncio.run(latency(args.probes, args.seed, gap))
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
