"""Put the userspace delay proxy in front of each service, and measure the RTT through it."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import redis

from benchmarks.processes import free_port, spawn, wait_for_port
from benchmarks.systems.base import REPO_ROOT, Endpoints, Service

RTT_SAMPLES = 50


def start_proxies(
    direct: Endpoints, rtt_ms: float, services: set[Service], log_dir: Path
) -> tuple[Endpoints, list[subprocess.Popen[bytes]]]:
    """Start one proxy per service and return the endpoints that go through them."""
    addresses = dict(direct.addresses)
    procs = []
    for service in sorted(services):
        port = free_port()
        argv = [
            sys.executable, "-m", "benchmarks.proxy", "--listen", f"127.0.0.1:{port}",
            "--target", f"{direct.host(service)}:{direct.port(service)}", "--rtt-ms", str(rtt_ms),
        ]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        proc = spawn(argv, env, log_dir / f"proxy-{service}.log")
        procs.append(proc)
        wait_for_port("127.0.0.1", port, 10.0, proc)
        addresses[service] = ("127.0.0.1", port)
    return Endpoints(addresses, direct.state_dir), procs


def measure_rtt_ms(endpoints: Endpoints, service: Service) -> float:
    """Median time of a trivial round trip (``SELECT 1`` or ``PING``) on an open connection."""
    samples = []
    if service == "redis":
        client = redis.Redis(host=endpoints.host(service), port=endpoints.port(service))
        client.ping()
        for _ in range(RTT_SAMPLES):
            started = time.perf_counter()
            client.ping()
            samples.append(time.perf_counter() - started)
        client.close()
    elif service == "postgresql":
        from benchmarks.rawsql import server_conninfo

        with psycopg.connect(**server_conninfo(endpoints)) as conn:
            for _ in range(RTT_SAMPLES):
                started = time.perf_counter()
                conn.execute("SELECT 1").fetchone()
                samples.append(time.perf_counter() - started)
    else:
        import MySQLdb

        conn = MySQLdb.connect(
            host=endpoints.host(service), port=endpoints.port(service), user="root", password=""
        )
        cursor = conn.cursor()
        for _ in range(RTT_SAMPLES):
            started = time.perf_counter()
            cursor.execute("SELECT 1")
            cursor.fetchall()
            samples.append(time.perf_counter() - started)
        conn.close()
    return statistics.median(samples) * 1000
