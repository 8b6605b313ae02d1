"""``python -m benchmarks``: the command-line entry point.

Everything a command needs beyond the standard library is imported when it runs, so that
``--help`` works in any environment that has this checkout (the README's ``.venv`` has none of
the peers, psutil or rich).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import snapshot
from benchmarks.marker import COUNT_ENV, COUNT_METHODS
from benchmarks.scenario_names import ALL_SCENARIOS, EXTRA_SCENARIOS
from benchmarks.systems import SMOKE_SYSTEMS, SYSTEMS
from benchmarks.systems.base import (
    CORE_PATH_ENV,
    LOGGING_ENV,
    LOGGING_PROFILES,
    REPO_ROOT,
    RUN_ENV,
    Endpoints,
    Service,
    System,
    postgres_database,
    start_run,
)

if TYPE_CHECKING:
    from benchmarks.scenarios import RunContext

RAW_DIR = REPO_ROOT / "benchmarks" / "results" / "raw"
DOCS_DIR = REPO_ROOT / "docs" / "benchmarks"
SMOKE_DIR = REPO_ROOT / "benchmarks" / "results" / "smoke"
IDLE_SECONDS = 10.0  # an idle worker's CPU is measured over this long, after the latency probes
SMOKE_IDLE_SECONDS = 2.0
REQUIREMENTS = REPO_ROOT / "benchmarks" / "requirements.txt"

LOCK_PATH = Path(tempfile.gettempdir()) / "django-sqltasks-bench.lock"
SMOKE_TASKS = 300
SMOKE_PROBES = 5


def _list(value: str) -> list[str]:
    return [v for v in re.split(r"[,\s]+", value) if v]


def _rtt_ms(value: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|us|s)?", value.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"--rtt must look like 2ms, 500us or 0, not {value!r}")
    number, unit = float(match[1]), match[2] or "ms"
    return number * {"ms": 1.0, "us": 0.001, "s": 1000.0}[unit]


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="django-sqltasks beside other task queues (run), and profiles of "
        "django-sqltasks alone (scale, mixed); docs/benchmarks.md has the method and figures.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the suite and write the results")
    run.add_argument("--systems", type=_list, help=f"of {', '.join(SYSTEMS)} (default all)")
    run.add_argument(
        "--scenarios", type=_list, default=list(ALL_SCENARIOS),
        help=f"of {', '.join(ALL_SCENARIOS)} (default all); also, run only when named, "
        f"{', '.join(EXTRA_SCENARIOS)} (django-sqltasks alone)",
    )  # fmt: skip
    run.add_argument("-n", "--tasks", type=_positive, default=5000, help="tasks per run (5000)")
    run.add_argument("--rtt", type=_rtt_ms, default=0.0, help="added round-trip time, e.g. 2ms")
    run.add_argument("--repeat", type=_positive, default=3, help="interleaved repeats (3)")
    run.add_argument("--concurrency", type=_positive, default=200, help="worker concurrency (200)")
    run.add_argument("--in-flight", type=_positive, default=200, help="enqueues in flight (200)")
    run.add_argument(
        "--arrival",
        choices=["lanes", "semaphore"],
        default="lanes",
        help="how enqueues arrive: --in-flight coroutines each looping over a shared counter "
        "(lanes, the default), or one coroutine per task gathered behind an "
        "asyncio.Semaphore(--in-flight) (semaphore)",
    )
    run.add_argument("--probes", type=_positive, default=40, help="latency probes per run (40)")
    run.add_argument("--http-connections", type=_positive, default=50, help="HTTP clients (50)")
    run.add_argument("--http-requests", type=_positive, default=2000, help="HTTP requests (2000)")
    run.add_argument("--profile", help="result name (default: local, or rtt-2ms with --rtt 2ms)")
    run.add_argument("--out", type=Path, help="where summaries go (default docs/benchmarks)")
    run.add_argument(
        "--core-ref",
        default=snapshot.HEAD,
        help="git ref of django_sqltasks to benchmark (HEAD), or 'worktree' for the files as is "
        "(what HEAD means where there is no git checkout, as in the bench image)",
    )
    run.add_argument(
        "--count",
        choices=COUNT_METHODS,
        default="body",
        help="how completions are counted: by each task as its last statement (body, the "
        "default: the same for every system) or by a receiver of each system's task-finished "
        "signal (signal)",
    )
    run.add_argument(
        "--logging",
        choices=LOGGING_PROFILES,
        default="default",
        help="Django's LOGGING for every system: what a new project has (default), or every "
        "logger at WARNING (quiet)",
    )
    run.add_argument(
        "--smoke",
        action="store_true",
        help="few tasks; our PostgreSQL and SQLite rows, a peer, the bare-SQL rows; 1 repeat "
        "(CI: that every system runs; its figures are not comparable with the published ones)",
    )
    run.add_argument(
        "--keep-databases",
        action="store_true",
        help="keep the databases the run created (named *_<start time>_<4 hex digits>; "
        "dropped at the end by default)",
    )
    sub.add_parser("report", help="rebuild tables, charts and docs/benchmarks.md from the JSON")
    sub.add_parser("setup", help="install the peers and tools into the current environment")
    trips = sub.add_parser(
        "roundtrips",
        help="count the round trips of each path, enqueue to outcome, on PostgreSQL "
        "(scripts/round_trips.py on the benchmark's server; empties its task table)",
    )
    trips.add_argument("--calls", type=_positive, default=20, help="calls of each path (20)")
    trips.add_argument(
        "--out", type=Path, default=DOCS_DIR, help="where its section goes (docs/benchmarks)"
    )
    summ = sub.add_parser("summarize", help="summarize a raw JSONL log, e.g. of an interrupted run")
    # Parsed by their own modules (main hands them the rest of the line): listed for --help.
    sub.add_parser(
        "scale",
        help="django-sqltasks alone at 1,000,000 finished tasks: the admin's pages, the claim, "
        "the enqueue, a day's prune (python -m benchmarks scale --help)",
    )
    sub.add_parser(
        "mixed",
        help="a steady load through a database that also holds snapshots, on private "
        "PostgreSQL servers (python -m benchmarks mixed --help)",
    )
    sub.add_parser(
        "fleet",
        help="40 worker processes (10 machines of 4) on one server at max_connections = 100, "
        "behind PgBouncer, beside one (python -m benchmarks fleet --help)",
    )
    summ.add_argument("raw", type=Path)
    summ.add_argument("--out", type=Path, default=DOCS_DIR)
    return parser


@dataclass
class Plan:
    systems: list[System]
    scenarios: list[str]
    tasks: int
    repeat: int
    rtt_ms: float
    profile: str
    out: Path
    write_page: bool


def make_plan(args: argparse.Namespace) -> Plan:
    chosen, tasks, repeat, out = args.scenarios, args.tasks, args.repeat, args.out
    systems = args.systems or list(SMOKE_SYSTEMS if args.smoke else SYSTEMS)
    if args.smoke:
        tasks, repeat, args.probes = min(tasks, SMOKE_TASKS), 1, SMOKE_PROBES
        args.http_requests = min(args.http_requests, SMOKE_TASKS)
        out = out or SMOKE_DIR
    unknown = [s for s in systems if s not in SYSTEMS] + [
        s for s in chosen if s not in (*ALL_SCENARIOS, *EXTRA_SCENARIOS)
    ]
    if unknown:
        raise SystemExit(f"unknown system or scenario: {', '.join(unknown)}")
    rtt_label = f"{args.rtt:g}ms".replace(".", "_")
    profile = args.profile or (
        "smoke" if args.smoke else "local" if not args.rtt else f"rtt-{rtt_label}"
    )
    return Plan(
        systems=[SYSTEMS[s] for s in systems],
        scenarios=[s for s in (*ALL_SCENARIOS, *EXTRA_SCENARIOS) if s in chosen],
        tasks=tasks,
        repeat=repeat,
        rtt_ms=args.rtt,
        profile=profile,
        out=out or DOCS_DIR,
        write_page=out is None or Path(out).resolve() == DOCS_DIR.resolve(),
    )


def _runs(plan: Plan) -> list[tuple[int, str, System]]:
    """Repeats outermost, so systems interleave and slow drifts hit every system alike."""
    from benchmarks import fairness, waiters

    return [
        (rep, scenario, system)
        for rep in range(1, plan.repeat + 1)
        for scenario in plan.scenarios
        for system in plan.systems
        if system.runs(scenario)
        and (scenario != "fairness" or fairness.supports(system))
        and (scenario != "waiters" or waiters.supports(system))
    ]


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from benchmarks import environment, network, page, processes, report, scenarios, services

    console = Console(stderr=True)
    plan = make_plan(args)
    # Two runs at once would flush each other's databases and share the CPU.
    lock = open(LOCK_PATH, "w")  # noqa: SIM115 - held for the whole run
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        console.print(f"[red]another benchmark run holds {LOCK_PATH}; wait for it to finish")
        return 2
    processes.install_cleanup()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    RAW_DIR.mkdir(parents=True, exist_ok=True)
    raw_path = RAW_DIR / f"{stamp}-{plan.profile}.jsonl"
    log_dir = RAW_DIR / f"{stamp}-{plan.profile}-logs"
    state_dir = tempfile.mkdtemp(prefix="django-sqltasks-bench-")
    # Read by every subprocess the run starts (django_env copies this environment).
    os.environ[COUNT_ENV] = args.count
    os.environ[LOGGING_ENV] = args.logging
    start_run()
    snapshot.compile_sources()
    core_ref = snapshot.effective_ref(args.core_ref)
    if core_ref != args.core_ref:
        console.print(f"no git checkout: benchmarking the files in {REPO_ROOT} as they are")
    core = snapshot.extract(core_ref, Path(state_dir) / "core")
    if core is not None:
        os.environ[CORE_PATH_ENV] = str(core)
    direct = Endpoints(state_dir=state_dir)
    load = _load_average()
    console.print(f"load average at the start: {load} (1, 5, 15 min; {os.cpu_count()} cores)")
    meta: dict[str, Any] = {
        "profile": plan.profile,
        "command": " ".join(["python -m benchmarks", *sys.argv[1:]]),
        "started_at": stamp,
        "tasks": plan.tasks,
        "repeat": plan.repeat,
        "concurrency": args.concurrency,
        "in_flight": args.in_flight,
        "arrival": args.arrival,
        "probes": args.probes,
        "http_connections": args.http_connections,
        "http_requests": args.http_requests,
        "rtt_requested_ms": plan.rtt_ms,
        "count": args.count,
        "logging": args.logging,
        "machine": environment.describe(direct),
        "django_sqltasks": snapshot.describe(core_ref),
        "smoke": args.smoke,
        "load_average": {"start": load},
    }
    records: list[dict[str, Any]] = []
    try:
        endpoints = direct
        needed: set[Service] = {s for system in plan.systems for s in system.services}
        meta["rtt_measured_ms"] = {s: round(network.measure_rtt_ms(direct, s), 3) for s in needed}
        if plan.rtt_ms:
            endpoints, _ = network.start_proxies(direct, plan.rtt_ms, needed, log_dir)
            meta["rtt_through_proxy_ms"] = {
                s: round(network.measure_rtt_ms(endpoints, s), 3) for s in needed
            }
        ctx = scenarios.RunContext(
            endpoints=endpoints,
            admin=direct,
            concurrency=args.concurrency,
            in_flight=args.in_flight,
            arrival=args.arrival,
            probes=args.probes,
            http_connections=args.http_connections,
            http_requests=args.http_requests,
            log_dir=log_dir,
            idle_seconds=SMOKE_IDLE_SECONDS if args.smoke else IDLE_SECONDS,
        )
        broken: dict[str, str] = {}
        for system in plan.systems:
            try:
                services.prepare(system, direct)
            except Exception as e:
                broken[system.name] = f"setup failed: {e}"
                console.print(f"[red]{system.name}: {broken[system.name]}")
        runs = _runs(plan)
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console) as progress, raw_path.open("a") as raw:
            raw.write(json.dumps({"meta": meta}) + "\n")
            bar = progress.add_task("benchmarks", total=len(runs))
            for rep, scenario, system in runs:
                progress.update(
                    bar, description=f"{plan.profile} #{rep} {scenario:<7} {system.name:<16}"
                )
                record = _one(system, scenario, rep, plan, ctx, broken)
                records.append(record)
                raw.write(json.dumps(record) + "\n")
                raw.flush()
                if not record["ok"]:
                    progress.console.print(
                        f"[red]{system.name} {scenario} #{rep}: {record['error'][:2000]}"
                    )
                progress.advance(bar)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping every process the harness started")
        processes.stop_all()
        return 130
    finally:
        processes.stop_all()
        shutil.rmtree(state_dir, ignore_errors=True)
        _drop_databases(console, direct, keep=args.keep_databases)
    meta["load_average"]["end"] = _load_average()
    summary = report.summarize(records, meta)
    report.write(summary, plan.out)
    print(report.markdown(summary))
    if plan.write_page:
        page.write(DOCS_DIR, REPO_ROOT / "docs" / "benchmarks.md")
    console.print(f"raw runs: {raw_path.relative_to(REPO_ROOT)}; summary: {plan.out}")
    console.print(f"load average at the end: {meta['load_average']['end']}")
    if args.smoke:
        console.print(f"[yellow]{report.SMOKE_NOTE}")
    failed = [r for r in records if not r["ok"]]
    if failed:
        console.print(f"[red]{len(failed)} of {len(records)} runs failed")
        return 1
    return 0


def _load_average() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def _drop_databases(console: Any, endpoints: Endpoints, *, keep: bool) -> None:
    """Drop the databases the run created, unless asked to keep them."""
    from benchmarks import services

    if keep:
        console.print(f"databases kept: those named *_{os.environ[RUN_ENV]}")
        return
    try:
        services.drop_created(endpoints)
    except Exception as e:  # a run's figures are worth more than its clean-up
        console.print(f"[red]could not drop the run's databases (*_{os.environ[RUN_ENV]}): {e}")


def _one(
    system: System,
    scenario: str,
    rep: int,
    plan: Plan,
    ctx: RunContext,
    broken: dict[str, str],
) -> dict[str, Any]:
    from benchmarks import scenarios

    record: dict[str, Any] = {
        "profile": plan.profile,
        "system": system.name,
        "scenario": scenario,
        "repeat": rep,
        "rtt_ms": plan.rtt_ms,
        "sleep": "async" if system.async_sleep else "sync",
        "concurrency": system.effective_concurrency(ctx.concurrency),
        "at": time.time(),
    }
    if system.name in broken:
        return record | {"ok": False, "error": broken[system.name]}
    try:
        record |= scenarios.run(system, scenario, plan.tasks, ctx)
    except Exception as e:
        return record | {"ok": False, "error": f"{e.__class__.__name__}: {e}"}
    return record | {"ok": True}


def setup() -> int:
    """Install this project (editable) and the peers into the interpreter running this command."""
    uv = shutil.which("uv")
    base = (
        [uv, "pip", "install", "--compile-bytecode", "--python", sys.executable]
        if uv
        else [sys.executable, "-m", "pip", "install"]
    )
    return subprocess.call([*base, "-e", str(REPO_ROOT), "-r", str(REQUIREMENTS)])


def summarize_raw(raw: Path, out: Path) -> int:
    """Summarize the runs logged in ``raw`` (complete or not) exactly as ``run`` would."""
    from benchmarks import page, report

    lines = [json.loads(line) for line in raw.read_text().splitlines() if line.strip()]
    metas = [line["meta"] for line in lines if "meta" in line]
    if not metas:
        raise SystemExit(f"{raw} has no meta line (written by runs from this version on)")
    records = [line for line in lines if "system" in line]
    meta = metas[0] | {"completed_runs": len(records)}
    summary = report.summarize(records, meta)
    report.write(summary, out)
    print(report.markdown(summary))
    if out.resolve() == DOCS_DIR.resolve():
        page.write(DOCS_DIR, REPO_ROOT / "docs" / "benchmarks.md")
    return 0


def round_trips(calls: int, out: Path) -> int:
    """Print the round trips of each path (scripts/round_trips.py), on the PostgreSQL database
    django-sqltasks' rows use (``BENCH_PG_DATABASE``, or its own); write them as a section of
    the page into ``out`` and, where that is the docs' directory, rebuild the page; drop the
    database if it made it."""
    from benchmarks import page, services

    start_run()
    endpoints = Endpoints.from_env()
    services.create_database(endpoints, "postgresql", "bench_sqltasks")
    database = postgres_database(endpoints, "bench_sqltasks")
    url = f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}"
    script = REPO_ROOT / "scripts" / "round_trips.py"
    env = dict(os.environ, DATABASE_URL=url)
    section = out / page.ROUND_TRIPS
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(script), "--calls", str(calls), "--markdown", str(section)]
    try:
        code = subprocess.run(command, env=env).returncode
    finally:
        services.drop_created(endpoints)
    if code == 0 and out.resolve() == DOCS_DIR.resolve():
        page.write(DOCS_DIR, REPO_ROOT / "docs" / "benchmarks.md")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv else ""
    try:
        # Profiles of their own, with their own arguments (and --help).
        if command == "scale":
            from benchmarks.scale.cli import main as scale

            return scale(argv[1:])
        if command == "mixed":
            from benchmarks.mixed.cli import main as mixed

            return mixed(argv[1:])
        if command == "fleet":
            from benchmarks.fleet.cli import main as fleet

            return fleet(argv[1:])
        return _command(build_parser().parse_args(argv))
    except ModuleNotFoundError as e:
        raise SystemExit(
            f"python -m benchmarks {command} needs {e.name}, which this environment does not "
            "have: install the benchmark's dependencies (WITH_BENCH=1 scripts/venv.sh, or "
            "python -m benchmarks setup)"
        ) from e


def _command(args: argparse.Namespace) -> int:
    if args.command == "setup":
        return setup()
    if args.command == "summarize":
        return summarize_raw(args.raw, args.out)
    if args.command == "roundtrips":
        return round_trips(args.calls, args.out)
    if args.command == "report":
        from benchmarks import page, report

        for path in sorted(DOCS_DIR.glob("*.json")):
            summary = json.loads(path.read_text())
            report.write(summary, DOCS_DIR)
            print(report.markdown(summary))
        page.write(DOCS_DIR, REPO_ROOT / "docs" / "benchmarks.md")
        return 0
    return run(args)
