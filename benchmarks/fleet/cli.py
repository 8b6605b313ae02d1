"""``python -m benchmarks fleet``: many worker processes on one small PostgreSQL server.

As ten machines would run them, ``--machines`` supervisors (``tasks_worker --processes
--concurrency``) against one private PostgreSQL 15 server at ``max_connections = 100``
(pg_stat_statements loaded), beside a web app's share of connections held open, everything but
the ``LISTEN`` through a private PgBouncer in transaction mode (``LISTEN_DATABASE``, as
docs/configuration.md documents): the connections used, the claims one enqueue causes against an
idle fleet, then a steady rate of ORM tasks (one small write each, benchmarks/mixed/app.py) with
the server's CPU per task, the claims per task and the start latency; and the same with one
worker process, for comparison. django-sqltasks runs from the working tree this command runs in,
or from ``--core-ref``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import psycopg

from benchmarks import processes, snapshot
from benchmarks.fleet import summary
from benchmarks.fleet.probes import CLAIM_MATCH, claims
from benchmarks.metrics import tree_cpu_seconds
from benchmarks.mixed import app
from benchmarks.mixed.cli import _uptime, log
from benchmarks.mixed.sampler import Events, server_cpu_seconds
from benchmarks.systems.base import CORE_PATH_ENV, REPO_ROOT, Endpoints, django_env, manage
from benchmarks.systems.sqltasks import DIRECT_PORT_ENV, SQLTASKS_PG
from tests.gauntlet_postgres import PrivatePostgres, find_bindir
from tests.pgbouncer import PgBouncer, find_pgbouncer

DOCS_DIR = REPO_ROOT / "docs" / "benchmarks" / "fleet"
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results" / "fleet"
DATABASE = "bench_fleet"
PG_VERSION = 15
WORKER_APP = "fleet-worker"  # the workers' application_name (PGAPPNAME)
WEB_APP = "fleet-web"  # the web app's share, held open by the harness
READY_TIMEOUT = 300.0  # seconds for every worker process to register (40 start slowly on 2 cores)
SAMPLE_EVERY = 0.5  # seconds between counts of the connections
SMOKE = {"machines": 2, "processes": 2, "probes": 5, "idle": 2.0, "seconds": 5.0, "rate": 20.0}


@dataclass(frozen=True)
class Shape:
    """One configuration: ``machines`` supervisors of ``processes`` each, or a lone worker
    (``processes`` None: ``tasks_worker`` without ``--processes``)."""

    name: str
    machines: int
    processes: int | None

    @property
    def worker_processes(self) -> int:
        return self.machines * (self.processes or 1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks fleet", description=__doc__)
    add = parser.add_argument
    add("--machines", type=int, default=10, help="supervisors, one a machine (10)")
    add("--processes", type=int, default=4, help="worker processes a supervisor runs (4)")
    add("--concurrency", type=int, default=10, help="each worker process's concurrency (10)")
    add("--rate", type=float, default=100.0, help="tasks enqueued per second, steady (100)")
    add("--seconds", type=float, default=60.0, help="seconds of steady traffic (60)")
    add("--probes", type=int, default=40, help="tasks enqueued one at a time, idle fleet (40)")
    add("--idle", type=float, default=10.0, help="seconds the idle fleet's polls are counted (10)")
    add("--max-connections", type=int, default=100, help="the server's max_connections (100)")
    add("--web", type=int, default=20, help="connections the web app holds open (20)")
    add("--pool-size", type=int, default=60, help="PgBouncer's server connections (60)")
    add("--accounts", type=int, default=10_000, help="rows of the app's table (10,000)")
    add("--shapes", default="one,fleet", help="one (a lone worker), fleet, or both (one,fleet)")
    add("--core-ref", default=snapshot.WORKTREE, help="git ref of django_sqltasks (worktree)")
    add("--pg-bindir", type=Path, help=f"server binaries (default PostgreSQL {PG_VERSION}'s)")
    add("--profile", help="result name (default: fleet, or fleet-REF with --core-ref)")
    add("--out", type=Path, help="where the results go (default docs/benchmarks/fleet)")
    add("--smoke", action="store_true", help="2 machines of 2, a few seconds (CI)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    bindir = args.pg_bindir or find_bindir(PG_VERSION)
    bouncer_binary = find_pgbouncer()
    if bindir is None or not (bindir / "initdb").exists():
        raise SystemExit(f"--pg-bindir: no PostgreSQL {PG_VERSION} server binaries (initdb)")
    if bouncer_binary is None:
        raise SystemExit("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
    shapes = {
        "one": Shape("one", 1, None),
        "fleet": Shape("fleet", args.machines, args.processes),
    }
    chosen = [shapes[name] for name in args.shapes.split(",") if name in shapes]
    profile = args.profile or (
        "fleet-smoke" if args.smoke else "fleet" if args.core_ref == snapshot.WORKTREE
        else f"fleet-{args.core_ref}"
    )  # fmt: skip
    out = args.out or (RESULTS_DIR if args.smoke else DOCS_DIR)
    processes.install_cleanup()
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    os.environ.pop(CORE_PATH_ENV, None)
    core = snapshot.extract(args.core_ref, work / "core")
    if core is not None:
        os.environ[CORE_PATH_ENV] = str(core)
    os.environ["BENCH_PG_DATABASE"] = DATABASE
    os.environ["BENCH_PG_USER"] = "postgres"
    os.environ["BENCH_PG_PASSWORD"] = ""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    logs = RESULTS_DIR / f"{stamp}-{profile}-logs"
    meta: dict[str, Any] = {
        "profile": profile,
        "command": " ".join(["python -m benchmarks fleet", *argv]),
        "started_at": stamp,
        "core": snapshot.describe(args.core_ref),
        "machines": args.machines,
        "processes": args.processes,
        "concurrency": args.concurrency,
        "rate": args.rate,
        "seconds": args.seconds,
        "probes": args.probes,
        "max_connections": args.max_connections,
        "web": args.web,
        "pool_size": args.pool_size,
        "uptime_before": _uptime(),
    }
    log(f"uptime: {meta['uptime_before']}")
    result: dict[str, Any] = {"meta": meta, "shapes": {}}
    try:
        for shape in chosen:
            log(f"{shape.name}: {shape.worker_processes} worker process(es)")
            result["shapes"][shape.name] = run_shape(
                shape, args, bindir, bouncer_binary, work, logs
            )
    except KeyboardInterrupt:
        log("interrupted: the servers and every process started are stopped")
        return 130
    finally:
        processes.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    meta["uptime_after"] = _uptime()
    log(f"uptime: {meta['uptime_after']}")
    print(summary.markdown(result))
    write(result, out)
    log(f"results: {out}; logs: {logs}")
    return 0


def run_shape(
    shape: Shape,
    args: argparse.Namespace,
    bindir: Path,
    bouncer_binary: str,
    work: Path,
    logs: Path,
) -> dict[str, Any]:
    settings = {
        "shared_preload_libraries": "pg_stat_statements",
        "max_connections": str(args.max_connections),
    }
    with PrivatePostgres(bindir, DATABASE, settings) as server:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            app.create(conn.cursor(), args.accounts)
            version = conn.execute("SHOW server_version").fetchone()
        bouncer = PgBouncer(
            bouncer_binary,
            {"HOST": "127.0.0.1", "PORT": server.port, "USER": "postgres"},
            pool_size=args.pool_size,
            max_clients=5000,
        ).start()
        try:
            return _run_on(shape, args, server, bouncer, work, logs) | {
                "server_version": version[0] if version else None
            }
        finally:
            bouncer.stop()


def _run_on(
    shape: Shape,
    args: argparse.Namespace,
    server: PrivatePostgres,
    bouncer: PgBouncer,
    work: Path,
    logs: Path,
) -> dict[str, Any]:
    direct = Endpoints(addresses={"postgresql": ("127.0.0.1", server.port)}, state_dir=str(work))
    pooled = Endpoints(addresses={"postgresql": ("127.0.0.1", bouncer.port)}, state_dir=str(work))
    os.environ.pop(DIRECT_PORT_ENV, None)
    manage(SQLTASKS_PG, direct, "migrate", "--noinput", "-v", "0")
    os.environ[DIRECT_PORT_ENV] = str(server.port)
    env = django_env(SQLTASKS_PG, pooled) | {"PGAPPNAME": WORKER_APP}
    web = [
        psycopg.connect(server.url, autocommit=True, application_name=WEB_APP)
        for _ in range(args.web)
    ]
    workers = []
    counter = Connections(server, bouncer, workers)
    try:
        for machine in range(shape.machines):
            argv = [sys.executable, "-m", "django", "tasks_worker", "--queue", "default",
                    "--concurrency", str(args.concurrency),
                    "--worker-id", f"m{machine}"]  # fmt: skip
            if shape.processes is not None:
                argv += ["--processes", str(shape.processes)]
            workers.append(processes.spawn(argv, env, logs / f"{shape.name}-m{machine}.log"))
        _wait_registered(server.url, shape.worker_processes, workers)
        counter.start()
        time.sleep(2.0)  # their first claims and ticks
        figures = work / f"{shape.name}-probes.json"
        probe = subprocess.run(
            [sys.executable, "-m", "benchmarks.fleet.probes", "--url", server.url,
             "--probes", str(args.probes), "--idle", str(args.idle), "--figures", str(figures)],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if probe.returncode != 0:
            raise RuntimeError(f"the probes failed:\n{probe.stdout}\n{probe.stderr}")
        probes = json.loads(figures.read_text())
        steady = _steady(args, server, env, workers, work, logs / f"{shape.name}-enqueuer.log")
    finally:
        counter.close()
        for worker in workers:
            processes.stop(worker)
        for conn in web:
            conn.close()
    latencies = probes.pop("latencies")
    return {
        "machines": shape.machines,
        "processes": shape.processes,
        "worker_processes": shape.worker_processes,
        "connections": counter.figures(),
        "probes": probes | _percentiles(latencies),
        "steady": steady,
    }


def _steady(
    args: argparse.Namespace,
    server: PrivatePostgres,
    env: dict[str, str],
    workers: list[Any],
    work: Path,
    log_path: Path,
) -> dict[str, Any]:
    postmaster = server.postmaster_pid()
    assert postmaster is not None
    events = Events()
    events.start()
    times, figures = work / "steady-times", work / "steady-enqueuer.json"
    with psycopg.connect(server.url, autocommit=True, application_name="fleet-harness") as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
        server_cpu = server_cpu_seconds(postmaster)
        worker_cpu = sum(tree_cpu_seconds(w.pid) for w in workers)
        enqueuer = processes.spawn(
            [sys.executable, "-m", "benchmarks.mixed.enqueuer", "--system", "sqltasks",
             "--rate", str(args.rate), "--seconds", str(args.seconds), "--port", str(events.port),
             "--accounts", str(args.accounts), "--times", str(times), "--figures", str(figures)],
            env,
            log_path,
        )  # fmt: skip
        try:
            enqueuer.wait(timeout=args.seconds + 120)
            enqueued = len(array("d", times.read_bytes()))
            deadline = time.monotonic() + 60
            while len(events.tasks) < enqueued and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(0.5)
        finally:
            processes.stop(enqueuer)
            events.close()
        server_cpu = server_cpu_seconds(postmaster) - server_cpu
        worker_cpu = sum(tree_cpu_seconds(w.pid) for w in workers) - worker_cpu
        claim_calls = claims(conn)
    done = len(events.tasks)
    starts = [started - enqueued_at for _, enqueued_at, started, _ in events.tasks]
    return {
        "enqueuer": json.loads(figures.read_text()),
        "enqueued": enqueued,
        "done": done,
        "server_cpu_ms_per_task": 1000 * server_cpu / done if done else None,
        "worker_cpu_ms_per_task": 1000 * worker_cpu / done if done else None,
        "claims": claim_calls,
        "claims_per_task": claim_calls / done if done else None,
        # Each claim that found something took at least one task: the others found nothing.
        "empty_claims_at_least": max(0, claim_calls - done),
    } | _percentiles(starts)


class Connections(threading.Thread):
    """Every SAMPLE_EVERY: the server's client sessions by kind, and the workers' sockets."""

    def __init__(self, server: PrivatePostgres, bouncer: PgBouncer, workers: list[Any]) -> None:
        super().__init__(daemon=True)
        self._url = server.url
        self._ports = {server.port: "direct", bouncer.port: "pooled"}
        self._workers = workers
        self._closing = threading.Event()
        self.samples: list[dict[str, int]] = []

    def run(self) -> None:
        with psycopg.connect(self._url, autocommit=True, application_name="fleet-harness") as c:
            while not self._closing.wait(SAMPLE_EVERY):
                rows = c.execute(
                    "SELECT application_name, query FROM pg_stat_activity "
                    "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
                ).fetchall()
                sample = {
                    "server_sessions": len(rows),
                    "web": sum(1 for name, _ in rows if name == WEB_APP),
                    "listening": sum(
                        1
                        for _, query in rows
                        if (query or "").lstrip().upper().startswith("LISTEN")
                    ),
                } | self._sockets()
                sample["pooler_and_others"] = (
                    sample["server_sessions"] - sample["web"] - (sample["workers_direct"])
                )
                self.samples.append(sample)

    def _sockets(self) -> dict[str, int]:
        """The workers' TCP connections to the server and to the pooler, and the most one
        process holds."""
        counts = {"direct": 0, "pooled": 0}
        most = 0
        for worker in self._workers:
            try:
                family = [psutil.Process(worker.pid), *psutil.Process(worker.pid).children(True)]
            except psutil.NoSuchProcess:
                continue
            for process in family:
                try:
                    held = [
                        c for c in process.net_connections(kind="tcp")
                        if c.raddr and c.raddr.port in self._ports and c.status == "ESTABLISHED"
                    ]  # fmt: skip
                except psutil.NoSuchProcess:
                    continue
                for c in held:
                    counts[self._ports[c.raddr.port]] += 1
                most = max(most, len(held))
        return {"workers_direct": counts["direct"], "workers_pooled": counts["pooled"],
                "most_one_process": most}  # fmt: skip

    def close(self) -> None:
        self._closing.set()
        self.join(timeout=5)

    def figures(self) -> dict[str, Any]:
        if not self.samples:
            return {}
        keys = self.samples[0].keys()
        return {f"max_{k}": max(s[k] for s in self.samples) for k in keys} | {
            "samples": len(self.samples)
        }


def _wait_registered(url: str, count: int, workers: list[Any]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    with psycopg.connect(url, autocommit=True, application_name="fleet-harness") as conn:
        while time.monotonic() < deadline:
            for worker in workers:
                if worker.poll() is not None:
                    raise RuntimeError(f"a worker exited with {worker.returncode} at start")
            row = conn.execute("SELECT count(*) FROM django_sqltasks_workerrecord").fetchone()
            if row and row[0] >= count:
                return
            time.sleep(0.5)
    raise TimeoutError(f"the workers did not all register within {READY_TIMEOUT:g} s")


def _percentiles(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None, "n": 0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * p99,
        "max_ms": 1000 * ordered[-1],
        "n": len(ordered),
    }


def write(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    name = result["meta"]["profile"]
    (out / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
    (out / f"{name}.md").write_text(summary.markdown(result))
    if out.resolve() == DOCS_DIR.resolve():
        from benchmarks import page

        page.write(DOCS_DIR.parent, REPO_ROOT / "docs" / "benchmarks.md")


__all__ = ["CLAIM_MATCH", "main"]
