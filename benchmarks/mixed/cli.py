"""``python -m benchmarks mixed``: a task queue in a database that also serves the app.

For each system (django-sqltasks, then the classic SKIP LOCKED table), on a private PostgreSQL 15
server of its own (initdb's defaults, autovacuum on, pg_stat_statements loaded), removed at the
end whatever happens: a steady rate of tasks, each one small write to the app's table, through
one worker at concurrency 8; a baseline; a middle phase in which analytics sessions and/or a
``pg_dump`` hold a snapshot; a recovery. It prints a table per system and phase, and writes the
JSON, the table and a chart. django-sqltasks runs from the working tree this command runs in.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import psycopg

from benchmarks import processes, snapshot
from benchmarks.mixed import app, classic, holders, summary
from benchmarks.mixed.sampler import Events, Sampler
from benchmarks.systems.base import CORE_PATH_ENV, REPO_ROOT, Endpoints, django_env, manage
from benchmarks.systems.raw_sql import RAW_SQL
from benchmarks.systems.sqltasks import SQLTASKS_PG
from tests.gauntlet_postgres import PrivatePostgres, find_bindir

DOCS_DIR = REPO_ROOT / "docs" / "benchmarks" / "mixed"
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results" / "mixed"
DATABASE = "bench_mixed"
PG_VERSION = 15
HOLDS = ("analytics", "pg_dump")
DATABASES = ("postgresql", "mariadb", "sqlite")
CLAIM_MATCH = "SKIP LOCKED"  # what django-sqltasks' claim statements (claim, claim_fair) contain
READY_TIMEOUT = 60.0  # seconds for a worker to connect
SETTLE = 1.0  # seconds after the worker's first connection before the first enqueue
WARNING_CODE = re.compile(r"\b(W00\d)\b")
# Every phase a few seconds, sessions every 2 s: the whole run, both systems, well under 60 s.
SMOKE = {"baseline": 4.0, "held": 6.0, "recovery": 4.0, "gap": 2.0, "drain": 10.0, "accounts": 1000}


@dataclass(frozen=True)
class QueueSystem:
    """How the profile sets up, runs and reads one system."""

    name: str
    label: str
    hot_table: str  # the table every live task is in: its dead versions are the figure
    kinds: dict[str, str]  # statement kind -> a substring of its text in pg_stat_statements


SYSTEMS = {
    "sqltasks": QueueSystem(
        "sqltasks",
        "django-sqltasks (PostgreSQL, partitioned task table)",
        "django_sqltasks_taskrecord_live",
        {
            "claim": CLAIM_MATCH,
            "finish": "WITH done AS",
            "enqueue": 'INSERT INTO "django_sqltasks_taskrecord"',
            "app_write": f"UPDATE {app.TABLE}",
        },
    ),
    "classic": QueueSystem(
        "classic",
        "classic table (SKIP LOCKED LIMIT 10, DELETE when done)",
        classic.TABLE,
        {
            "claim": "SKIP LOCKED",
            "finish": f"DELETE FROM {classic.TABLE}",
            "enqueue": f"INSERT INTO {classic.TABLE}",
            "app_write": f"UPDATE {app.TABLE}",
        },
    ),
}


def _positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {value}")
    return number


def _names(choices: Sequence[str]) -> Callable[[str], list[str]]:
    """An argument type: a comma-separated list, each one of ``choices``."""

    def parse(value: str) -> list[str]:
        names = [v for v in re.split(r"[,\s]+", value) if v]
        if not names or any(n not in choices for n in names):
            raise argparse.ArgumentTypeError(f"must be some of {', '.join(choices)}, not {value!r}")
        return names

    return parse


def _setting(value: str) -> tuple[str, str]:
    name, sep, setting = value.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"must look like NAME=VALUE, not {value!r}")
    return name.strip(), setting.strip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks mixed", description=__doc__)
    add = parser.add_argument
    add(
        "--database",
        choices=DATABASES,
        default="postgresql",
        help="postgresql (a private server, django-sqltasks and the classic table), mariadb "
        "(the server at BENCH_MARIADB_ADDR, 127.0.0.1:3306) or sqlite (a WAL file); see "
        "benchmarks/mixed/databases.py",
    )
    add(
        "--mariadb-database",
        default="bench_mixed",
        help="the MariaDB database the run creates and drops (bench_mixed)",
    )
    add("--rate", type=_positive, default=120.0, help="tasks enqueued per second (120)")
    add("--baseline", type=_positive, default=120.0, help="seconds before the snapshots (120)")
    add("--held", type=_positive, default=360.0, help="seconds the snapshots are held (360)")
    add("--recovery", type=_positive, default=120.0, help="seconds after them (120)")
    add("--hold", type=_names(HOLDS), default=["analytics"], help="analytics, pg_dump or both")
    add("--session", type=_positive, default=120.0, help="an analytics session's pg_sleep (120)")
    add("--gap", type=_positive, default=40.0, help="seconds between session starts (40)")
    add("--dump-rate", type=_positive, default=64.0, help="KiB/s pg_dump's output is read at (64)")
    add("--concurrency", type=int, default=8, help="the worker's concurrency (8)")
    add("--accounts", type=int, default=100_000, help="rows of the app's table (100,000)")
    add("--drain", type=_positive, default=60.0, help="seconds to wait for the last tasks (60)")
    add("--systems", type=_names(list(SYSTEMS)), default=list(SYSTEMS), help="sqltasks, classic")
    add(
        "--claim-match",
        default=CLAIM_MATCH,
        help="text of django-sqltasks' claim statements in pg_stat_statements "
        f"({CLAIM_MATCH!r}; the classic table's claim is fixed)",
    )
    add("--pg-bindir", type=Path, help=f"server binaries (default PostgreSQL {PG_VERSION}'s)")
    add(
        "--pg-setting",
        type=_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the private server besides initdb's defaults (repeatable)",
    )
    add(
        "--prepare-threshold",
        type=int,
        help="django-sqltasks' OPTIONS prepare_threshold (psycopg's prepared statements; "
        "default: Django's, off)",
    )
    add("--profile", help="result name (default: mixed, with the hold and a rate other than 120)")
    add("--out", type=Path, help="where the results go (default docs/benchmarks/mixed)")
    add("--smoke", action="store_true", help="a few seconds a phase, 1,000 rows (CI; under 60 s)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.concurrency < 1 or args.accounts < 1:
        raise SystemExit("--concurrency and --accounts: must be at least 1")
    if args.smoke:
        args.baseline, args.held, args.recovery = (
            SMOKE["baseline"],
            SMOKE["held"],
            SMOKE["recovery"],
        )
        args.gap, args.drain, args.accounts = SMOKE["gap"], SMOKE["drain"], int(SMOKE["accounts"])
    if args.database != "postgresql":
        if args.hold != ["analytics"] or args.systems != list(SYSTEMS):
            raise SystemExit("--hold and --systems: PostgreSQL's only (--database postgresql)")
        from benchmarks.mixed import databases

        return databases.main(args, argv, args.profile or _profile_name(args), args.out)
    bindir = args.pg_bindir or find_bindir(PG_VERSION)
    if bindir is None or not (bindir / "initdb").exists():
        raise SystemExit(
            f"--pg-bindir: no PostgreSQL {PG_VERSION} server binaries (initdb) at "
            f"{bindir or '/usr/lib/postgresql/15/bin'}"
        )
    profile = args.profile or _profile_name(args)
    out = args.out or (RESULTS_DIR if args.smoke else DOCS_DIR)
    processes.install_cleanup()
    # The working tree's django_sqltasks, whatever a caller's environment says.
    os.environ.pop(CORE_PATH_ENV, None)
    os.environ["BENCH_PG_DATABASE"] = DATABASE
    os.environ["BENCH_PG_USER"] = "postgres"
    os.environ["BENCH_PG_PASSWORD"] = ""
    if args.prepare_threshold is not None:
        os.environ["BENCH_PG_PREPARE_THRESHOLD"] = str(args.prepare_threshold)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    work = Path(tempfile.mkdtemp(prefix="bench-mixed-"))
    logs = RESULTS_DIR / f"{stamp}-{profile}-logs"
    settings = {"shared_preload_libraries": "pg_stat_statements", **dict(args.pg_setting)}
    meta: dict[str, Any] = {
        "profile": profile,
        "command": " ".join(["python -m benchmarks mixed", *argv]),
        "started_at": stamp,
        "rate": args.rate,
        "hold": args.hold,
        "seconds": {"baseline": args.baseline, "held": args.held, "recovery": args.recovery},
        "session_s": args.session,
        "gap_s": args.gap,
        "dump_rate_kib_s": args.dump_rate,
        "concurrency": args.concurrency,
        "accounts": args.accounts,
        "server_settings": settings,
        "uptime_before": _uptime(),
        **_commit(),
    }
    print(f"uptime: {meta['uptime_before']}", file=sys.stderr)
    result: dict[str, Any] = {"meta": meta, "systems": {}}
    try:
        for name in args.systems:
            system = SYSTEMS[name]
            log(f"{name}: starting a private PostgreSQL server")
            with PrivatePostgres(bindir, DATABASE, settings) as server:
                result["systems"][name] = run_system(system, server, args, work, logs, meta)
    except KeyboardInterrupt:
        log("interrupted: the servers and every process started are stopped")
        return 130
    finally:
        processes.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    meta["uptime_after"] = _uptime()
    print(f"uptime: {meta['uptime_after']}", file=sys.stderr)
    print(summary.markdown(result))
    write(result, out)
    log(f"results: {out}; logs: {logs}")
    if args.smoke:
        return _smoke_verdict(result)
    return 0


def run_system(
    system: QueueSystem,
    server: PrivatePostgres,
    args: argparse.Namespace,
    work: Path,
    logs: Path,
    meta: dict[str, Any],
) -> dict[str, Any]:
    """One system's whole run on ``server``: set up, load, hold, recover, drain."""
    endpoints = Endpoints(addresses={"postgresql": ("127.0.0.1", server.port)}, state_dir=str(work))
    with psycopg.connect(server.url, autocommit=True) as conn:
        meta["server_version"] = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        meta["autovacuum"] = conn.execute("SHOW autovacuum").fetchone()[0]  # type: ignore[index]
        meta["statements_source"] = "pg_stat_statements"
        app.create(conn.cursor(), args.accounts)
        if system.name == "classic":
            classic.create(conn.cursor())
    if system.name == "sqltasks":
        manage(SQLTASKS_PG, endpoints, "migrate", "--noinput", "-v", "0")
        env = django_env(SQLTASKS_PG, endpoints)
        argv = SQLTASKS_PG.worker_argv(args.concurrency)
    else:
        env = django_env(RAW_SQL, endpoints)
        argv = [sys.executable, "-m", "benchmarks.mixed.classic", "worker", "--url", server.url,
                "--concurrency", str(args.concurrency)]  # fmt: skip
    events = Events()
    events.start()
    # Each side's sessions named (libpq's PGAPPNAME, where the code sets none), so the server's
    # CPU is told by who spent it: server_cpu_by_role.
    worker_env = env | {"PGAPPNAME": "worker"}
    worker = processes.spawn(argv, worker_env, logs / f"{system.name}-worker.log")
    _wait_connected(server.url, worker)
    time.sleep(SETTLE)
    postmaster = server.postmaster_pid()
    assert postmaster is not None
    kinds = system.kinds | ({"claim": args.claim_match} if system.name == "sqltasks" else {})
    sampler = Sampler(server.url, [system.hot_table, app.TABLE], kinds, postmaster, worker.pid)
    sampler.start()
    total = args.baseline + args.held + args.recovery
    times, figures = work / f"{system.name}-times", work / f"{system.name}-enqueuer.json"
    enqueuer = processes.spawn(
        [sys.executable, "-m", "benchmarks.mixed.enqueuer", "--system", system.name,
         "--url", server.url, "--rate", str(args.rate), "--seconds", str(total),
         "--port", str(events.port), "--accounts", str(args.accounts),
         "--times", str(times), "--figures", str(figures)],
        env | {"PGAPPNAME": "enqueuer"},
        logs / f"{system.name}-enqueuer.log",
    )  # fmt: skip
    held: dict[str, Any] = {}  # what held the snapshots: the sessions', the dumps' records

    def hold(until: float, stopping: threading.Event) -> list[threading.Thread]:
        threads, records = _hold(args, server, until, stopping)
        held.update(records)
        return threads

    bounds, enqueued = run_phases(args, worker, enqueuer, events, sampler, hold, times)
    result = summary.system_figures(
        enqueued, events.tasks, sampler.samples, bounds, system.hot_table
    )
    result |= {
        "label": system.label,
        "statement_kinds": kinds,
        "enqueuer": json.loads(figures.read_text()),
        "holders": held,
        "top_statements": sampler.top,
        "server_cpu_by_role": sampler.cpu_by_role,
        "worker_warnings": _warnings(logs / f"{system.name}-worker.log"),
    }
    return result


class PhaseSampler(Protocol):
    samples: list[dict[str, Any]]

    def mark(self, phase: str) -> None: ...

    def close(self) -> None: ...


def run_phases(
    args: argparse.Namespace,
    worker: Any,
    enqueuer: Any,
    events: Events,
    sampler: PhaseSampler,
    hold: Callable[[float, threading.Event], list[threading.Thread]],
    times: Path,
) -> tuple[dict[str, tuple[float, float]], array[float]]:
    """From the enqueuer's start: the baseline, the held phase (``hold`` starts the threads
    that hold snapshots until the monotonic time it is given), the recovery and the drain,
    each marked on ``sampler``; then everything stopped. The phases' bounds (epoch seconds)
    and every task's enqueue time."""
    wall = _first_report(events, enqueuer)
    sampler.mark("baseline")
    start = time.monotonic() - (time.time() - wall)
    total = args.baseline + args.held + args.recovery
    bounds: dict[str, tuple[float, float]] = {}
    stopping = threading.Event()
    try:
        _until(start + args.baseline, worker, enqueuer, events, "baseline")
        bounds["baseline"] = (wall, wall + (time.monotonic() - start))
        sampler.mark("held")
        held_start = time.monotonic()
        threads = hold(held_start + args.held, stopping)
        _until(held_start + args.held, worker, enqueuer, events, "held")
        for thread in threads:
            thread.join()
        bounds["held"] = (bounds["baseline"][1], wall + (time.monotonic() - start))
        sampler.mark("recovery")
        _until(start + total, worker, enqueuer, events, "recovery")
        enqueuer.wait(timeout=READY_TIMEOUT)
        # The schedule's end, not the enqueuer's exit a moment later.
        bounds["recovery"] = (bounds["held"][1], wall + total)
        sampler.mark("drain")
        enqueued = array("d", times.read_bytes())
        _drain(events, len(enqueued), args.drain)
        sampler.mark("end")
    finally:
        stopping.set()
        sampler.close()
        processes.stop(worker)
        processes.stop(enqueuer)
        events.close()
    return bounds, enqueued


def _hold(
    args: argparse.Namespace, server: PrivatePostgres, until: float, stopping: threading.Event
) -> tuple[list[threading.Thread], dict[str, Any]]:
    held: dict[str, Any] = {}
    threads = []
    if "analytics" in args.hold:
        analytics = holders.Analytics(server.url, args.session, args.gap)
        held["sessions"] = analytics.sessions
        threads.append(threading.Thread(target=analytics.run, args=(until, stopping)))
    if "pg_dump" in args.hold:
        dump = holders.Dump(server.bindir / "pg_dump", server.url, args.dump_rate * 1024)
        held["dumps"] = dump.dumps
        threads.append(threading.Thread(target=dump.run, args=(until, stopping)))
    for thread in threads:
        thread.start()
    return threads, held


def _until(deadline: float, worker: Any, enqueuer: Any, events: Events, phase: str) -> None:
    """Wait for ``deadline``, failing loudly if the worker or the enqueuer dies; a line every
    10 s says how it goes."""
    next_line = time.monotonic() + 10
    while (left := deadline - time.monotonic()) > 0:
        for proc, what in ((worker, "worker"), (enqueuer, "enqueuer")):
            if proc.poll() is not None and not (what == "enqueuer" and proc.returncode == 0):
                raise RuntimeError(f"the {what} exited with {proc.returncode} during {phase}")
        time.sleep(min(left, 0.5))
        if time.monotonic() >= next_line:
            next_line += 10
            enqueued = events.progress[-1][0] if events.progress else 0
            done, load = len(events.tasks), os.getloadavg()[0]
            log(f"{phase}: {enqueued:,} enqueued, {done:,} done, load average {load:.1f}")


def _first_report(events: Events, enqueuer: Any) -> float:
    """The moment the enqueuer started its schedule (its first report, sent just before)."""
    deadline = time.monotonic() + READY_TIMEOUT
    while not events.progress:
        if enqueuer.poll() is not None:
            raise RuntimeError(f"the enqueuer exited with {enqueuer.returncode} at start")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the enqueuer did not start within {READY_TIMEOUT:g} s")
        time.sleep(0.01)
    return events.progress[0][1]


def _drain(events: Events, enqueued: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while len(events.tasks) < enqueued and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)  # the datagrams of the last tasks


def _wait_connected(url: str, worker: Any) -> None:
    """Until the worker has a session on the database (it has started), or fail."""
    deadline = time.monotonic() + READY_TIMEOUT
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited with {worker.returncode} at start")
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.1)
    raise TimeoutError(f"the worker did not connect within {READY_TIMEOUT:g} s")


def _warnings(path: Path) -> dict[str, int]:
    """How many times the worker's log names each check code (W004 dead versions, W005 a long
    transaction, ...)."""
    if not path.exists():
        return {}
    return dict(collections.Counter(WARNING_CODE.findall(path.read_text(errors="replace"))))


def write(result: dict[str, Any], out: Path) -> None:
    """The JSON, the table and the chart under ``out``; the benchmarks page if it is the docs'."""
    out.mkdir(parents=True, exist_ok=True)
    name = result["meta"]["profile"]
    result["meta"]["chart"] = f"{name}.png"
    summary.chart(result, out / f"{name}.png")
    (out / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
    (out / f"{name}.md").write_text(summary.markdown(result))
    if out.resolve() == DOCS_DIR.resolve():
        from benchmarks import page

        page.write(DOCS_DIR.parent, REPO_ROOT / "docs" / "benchmarks.md")


def _smoke_verdict(result: dict[str, Any]) -> int:
    """The smoke run fails if a system completed nothing in a phase or lost a task."""
    failures = []
    for name, system in result["systems"].items():
        if system["lost"]:
            failures.append(f"{name}: {system['lost']} tasks not started")
        for phase in summary.PHASES:
            if not system["phases"][phase]["completed_per_s"]:
                failures.append(f"{name}: nothing completed in {phase}")
    for failure in failures:
        log(f"smoke: {failure}")
    return 1 if failures else 0


def _profile_name(args: argparse.Namespace) -> str:
    parts = ["mixed"] + ([args.database] if args.database != "postgresql" else [])
    if args.hold != ["analytics"]:
        parts.append("-".join(h.replace("_", "") for h in args.hold))
    if args.rate != 120:
        parts.append(f"{args.rate:g}")
    if args.smoke:
        parts.append("smoke")
    return "-".join(parts)


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def _commit() -> dict[str, Any]:
    described = snapshot.describe(snapshot.HEAD)
    return {"commit": described["commit"], "dirty": bool(described["worktree_dirty"])}


def log(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", file=sys.stderr, flush=True)
