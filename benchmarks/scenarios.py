"""One run of one scenario for one system: throughput (NoOp, Sleep), latency, or HTTP."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import fairness, loadgen, services, waiters
from benchmarks.marker import EXPECTED_ENV, MARKER_ADDR_ENV, MarkerListener
from benchmarks.metrics import TreeSampler, percentile, tree_cpu_seconds, vm_hwm_bytes
from benchmarks.processes import free_port, spawn, stop, wait_for_port
from benchmarks.scenario_names import ALL_SCENARIOS, THROUGHPUT_SCENARIOS
from benchmarks.systems.base import SUBPROCESS_CWD, Endpoints, System, django_env

BUSY_PROBES_PER_PROBE = 5  # busy probes are cheap: five for each --probes
MB = 1024 * 1024
AGENT_TIMEOUT = 600.0  # seconds
HTTP_START_TIMEOUT = 60.0  # seconds


@dataclass(frozen=True)
class RunContext:
    """What every run shares: where services are, for the clients and for the harness."""

    endpoints: Endpoints  # what workers and clients use (the proxies under --rtt)
    admin: Endpoints  # direct addresses, for resets and migrations
    concurrency: int
    in_flight: int
    probes: int
    http_connections: int
    http_requests: int
    log_dir: Path
    arrival: str = "lanes"  # how the enqueuer's coroutines arrive (benchmarks.agent.ARRIVALS)
    idle_seconds: float = 10.0  # how long an idle worker's CPU use is measured

    def log(self, system: System, what: str) -> Path:
        return self.log_dir / f"{system.name}-{what}.log"


def _agent(system: System, ctx: RunContext, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.agent", *args],
        env=django_env(system, ctx.endpoints),
        cwd=SUBPROCESS_CWD,
        capture_output=True,
        text=True,
        timeout=AGENT_TIMEOUT,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"agent {args[0]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def _ports(system: System, ctx: RunContext) -> list[int]:
    return [ctx.endpoints.port(s) for s in system.services]


def _process_timeout(system: System, scenario: str, n: int, ctx: RunContext) -> float:
    """A deadline far above any plausible run: one minute of start-up plus 40 ms per task."""
    return 60.0 + n * 0.040


def run_throughput(system: System, scenario: str, n: int, ctx: RunContext) -> dict[str, Any]:
    """Enqueue ``n`` tasks, then time a fresh worker from Popen to the N-th completion."""
    services.reset(system, ctx.admin)
    count = system.tasks_for(n)
    enqueue = _agent(
        system,
        ctx,
        "enqueue",
        "--task",
        scenario,
        "-n",
        str(count),
        "--in-flight",
        str(ctx.in_flight),
        "--arrival",
        ctx.arrival,
    )
    listener = MarkerListener()
    env = django_env(system, ctx.endpoints)
    env[MARKER_ADDR_ENV] = listener.address
    env[EXPECTED_ENV] = str(count)
    log = ctx.log(system, scenario)
    started = time.time()
    worker = spawn(system.worker_argv(ctx.concurrency), env, log)
    sampler = TreeSampler(worker.pid, _ports(system, ctx))
    sampler.start()
    try:
        deadline = time.monotonic() + _process_timeout(system, scenario, count, ctx)
        finished = listener.wait_done(deadline, alive=lambda: worker.poll() is None)
        # The worker tree's CPU from Popen to the N-th completion, start-up included (the same
        # for every system); read before the stop, which would add the shutdown's.
        cpu_seconds = tree_cpu_seconds(worker.pid)
        sampler.stop()
        sampler.sample()
        hwm = vm_hwm_bytes(worker.pid)
    finally:
        sampler.stop()
        stop(worker)
        listener.close()
    if not finished:
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise RuntimeError(
            f"worker did not finish {count} tasks (exit code {worker.returncode}); "
            f"log tail:\n{tail}"
        )
    events = listener.events
    assert events.done_at is not None
    assert events.first_at is not None
    return {
        "tasks": count,
        "enqueue_ops": enqueue["ops"],
        "process_ops": count / (events.done_at - started),
        "process_seconds": events.done_at - started,
        "cold_start_s": events.first_at - started,
        "peak_rss_mb": sampler.peak_rss / MB,
        "worker_cpu_s": cpu_seconds,
        "worker_cpu_us_per_task": cpu_seconds / count * 1e6,
        "parent_hwm_mb": (hwm or 0) / MB,
        "max_processes": sampler.max_processes,
        "max_connections": sampler.max_connections,
    }


def run_latency(system: System, ctx: RunContext, busy: bool = False) -> dict[str, Any]:
    """Paced probes: enqueue-to-start latency percentiles, against an idle worker (a probe
    every 0-1 s, then the idle worker's CPU), or a busy one (``busy``: a probe every 2-5 ms)."""
    services.reset(system, ctx.admin)
    worker = spawn(
        system.worker_argv(ctx.concurrency),
        django_env(system, ctx.endpoints),
        ctx.log(system, "busy" if busy else "latency"),
    )
    measured: dict[str, Any] = {}
    try:
        if busy:
            probes = str(ctx.probes * BUSY_PROBES_PER_PROBE)
            result = _agent(system, ctx, "latency", "--probes", probes, "--busy")
        else:
            result = _agent(system, ctx, "latency", "--probes", str(ctx.probes))
            # The worker has run its probes and waits for work: what does waiting cost?
            cpu_before, wall_before = tree_cpu_seconds(worker.pid), time.monotonic()
            time.sleep(ctx.idle_seconds)
            idle_cpu = tree_cpu_seconds(worker.pid) - cpu_before
            idle_wall = time.monotonic() - wall_before
            measured["idle_cpu_percent"] = 100 * idle_cpu / idle_wall
    finally:
        stop(worker)
    latencies = result["latencies"]
    return {
        **measured,
        "probes": len(latencies),
        "latency_p50_ms": percentile(latencies, 50) * 1000,
        "latency_p95_ms": percentile(latencies, 95) * 1000,
        "latency_p99_ms": percentile(latencies, 99) * 1000,
    }


def run_http(system: System, ctx: RunContext) -> dict[str, Any]:
    """Serve the async enqueue view with uvicorn and drive it with a fixed number of requests."""
    services.reset(system, ctx.admin)
    port = free_port()
    argv = [
        sys.executable, "-m", "uvicorn", "benchmarks.projects.asgi:application",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        "--no-access-log", "--loop", "asyncio", "--http", "h11", "--lifespan", "off",
    ]  # fmt: skip
    env = django_env(system, ctx.endpoints)
    # Django's default: each request closes its connection. Async views run their sync ORM calls
    # in a thread per request, so persistent connections would pile up to one per request thread.
    env["BENCH_CONN_MAX_AGE"] = "0"
    server = spawn(argv, env, ctx.log(system, "http"))
    try:
        wait_for_port("127.0.0.1", port, HTTP_START_TIMEOUT, server)
        asyncio.run(loadgen.run("127.0.0.1", port, "/enqueue", 1, 1))  # warm-up
        result = asyncio.run(
            loadgen.run(
                "127.0.0.1",
                port,
                "/enqueue",
                system.tasks_for(ctx.http_requests),
                ctx.http_connections,
            )
        )
    finally:
        stop(server)
    if result.errors:
        raise RuntimeError(f"{result.errors} of {result.requests} requests failed")
    return result.as_dict()


def run_bulk(system: System, n: int, ctx: RunContext) -> dict[str, Any]:
    """``n`` tasks in one ``enqueue_many`` call, then ``n`` in one ``aenqueue_many`` call; then
    sync ``enqueue()`` calls one at a time against as many plain ORM creates of the row."""
    services.reset(system, ctx.admin)
    result = _agent(system, ctx, "bulk", "-n", str(n))
    return {
        "tasks": n,
        "bulk_ops": n / result["sync_seconds"],
        "abulk_ops": n / result["async_seconds"],
        "enqueue_one_ops": result["single_enqueues"] / result["enqueue_seconds"],
        "orm_create_ops": result["single_enqueues"] / result["orm_create_seconds"],
    }


def run(system: System, scenario: str, n: int, ctx: RunContext) -> dict[str, Any]:
    if scenario in THROUGHPUT_SCENARIOS:
        return run_throughput(system, scenario, n, ctx)
    if scenario == "latency":
        return run_latency(system, ctx)
    if scenario == "busy":
        return run_latency(system, ctx, busy=True)
    if scenario == "http":
        return run_http(system, ctx)
    if scenario == "bulk":
        return run_bulk(system, n, ctx)
    if scenario == "fairness":
        return fairness.run(system, n, ctx)
    if scenario == "waiters":
        return waiters.run(system, n, ctx)
    raise ValueError(f"scenario must be one of {', '.join(ALL_SCENARIOS)}, not {scenario!r}")
