"""``python -m benchmarks mixed --database mariadb|sqlite``: the same scenario on the other
databases, each with its own version of the problem.

MariaDB: a transaction that holds a read view (``START TRANSACTION WITH CONSISTENT SNAPSHOT;
SELECT count(*) FROM app_account; SELECT SLEEP(s)``) stops InnoDB's purge: the history list
grows, and the delete-marked entries the claims and outcomes leave in the task table's indexes
stay. SQLite (WAL mode, as docs/databases.md sets it up): a read transaction in another
connection (``BEGIN; SELECT count(*) FROM app_account;`` held) keeps every checkpoint from
resetting the WAL, which grows while it is held.

The load, the phases, the sessions (overlapping, ``--gap`` apart) and the figures per phase are
the PostgreSQL run's (cli.py, summary.py); what differs is where the figures come from. Neither
database keeps statement statistics here (MariaDB's performance_schema is off by default), so
the worker and the enqueuer time their own statements (timing.py). The sampler reads, once a
second, MariaDB's history list length (``information_schema.INNODB_METRICS``, server-wide) and
its oldest transaction on this database (``information_schema.innodb_trx``), or the size of
SQLite's ``-wal`` and ``-shm`` files. The MariaDB server is a shared one (its history length
counts every database's transactions), so no server CPU is read; on SQLite the worker is the
database, and its CPU per task is the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import processes
from benchmarks.metrics import tree_cpu_seconds
from benchmarks.mixed import app, holders, summary, timing
from benchmarks.mixed.cli import (
    READY_TIMEOUT,
    SETTLE,
    _commit,
    _uptime,
    _warnings,
    log,
    run_phases,
)
from benchmarks.mixed.sampler import SAMPLE_EVERY, Events
from benchmarks.systems.base import CORE_PATH_ENV, REPO_ROOT, Endpoints, System, django_env, manage
from benchmarks.systems.sqltasks import DATABASE_NAME, SQLTASKS_MARIADB, SQLTASKS_SQLITE

DOCS_DIR = REPO_ROOT / "docs" / "benchmarks" / "mixed"
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results" / "mixed"
TASKS_TABLE = "django_sqltasks_taskrecord"

# The app's table, as on PostgreSQL (app.SCHEMA), in each database's types.
MARIADB_SCHEMA = f"""
CREATE TABLE {app.TABLE} (
    id integer PRIMARY KEY,
    balance bigint NOT NULL DEFAULT 0,
    updated_at datetime(6) NULL,
    note varchar(64) NOT NULL
) ENGINE=InnoDB
"""
MARIADB_FILL = f"""
INSERT INTO {app.TABLE} (id, note)
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < %s)
SELECT i, CONCAT(MD5(i), MD5(i + 1)) FROM s
"""
SQLITE_SCHEMA = f"""
CREATE TABLE {app.TABLE} (
    id integer PRIMARY KEY,
    balance integer NOT NULL DEFAULT 0,
    updated_at text,
    note text NOT NULL
)
"""
SQLITE_FILL = f"""
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?)
INSERT INTO {app.TABLE} (id, note) SELECT i, hex(randomblob(32)) FROM s
"""
HISTORY_SQL = (
    "SELECT count FROM information_schema.INNODB_METRICS WHERE name = 'trx_rseg_history_len'"
)
# The oldest transaction of this database's sessions (the shared server has others').
OLDEST_SQL = """
SELECT TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) / 1e6, t.trx_mysql_thread_id,
    LEFT(t.trx_query, 60)
FROM information_schema.innodb_trx AS t
JOIN information_schema.processlist AS p ON p.id = t.trx_mysql_thread_id
WHERE p.db = DATABASE() AND t.trx_mysql_thread_id <> CONNECTION_ID()
ORDER BY t.trx_started LIMIT 1
"""
MIB = 1024 * 1024
WORKER_STARTED = "Worker started"  # the worker's log line once it claims


@dataclass(frozen=True)
class Target:
    """One database the profile runs on besides PostgreSQL."""

    name: str
    label: str
    system: System
    kinds: timing.Kinds  # what timing.py reports: kind, the substrings of its statement
    gauges: tuple[tuple[str, str, float], ...]  # key, label, divisor (what the sampler reads)


ENQUEUE = ("enqueue", ["INSERT INTO", TASKS_TABLE])
APP_WRITE = ("app_write", [f"UPDATE {app.TABLE}"])
TARGETS = {
    "mariadb": Target(
        "mariadb",
        "django-sqltasks (MariaDB, InnoDB)",
        SQLTASKS_MARIADB,
        [
            ("claim", ["FOR UPDATE SKIP LOCKED"]),  # the locking SELECT: the index walk
            ("claim_update", ["SET status = 'RUNNING'"]),
            ("finish", ["AS v ON t.id = v.id"]),
            ENQUEUE,
            APP_WRITE,
        ],
        (("history_length", "InnoDB history list length (server-wide)", 1),),
    ),
    "sqlite": Target(
        "sqlite",
        "django-sqltasks (SQLite, WAL)",
        SQLTASKS_SQLITE,
        [
            ("claim", ["SET status = 'RUNNING'"]),  # the UPDATE ... RETURNING
            ("finish", ["WITH v("]),
            ENQUEUE,
            APP_WRITE,
        ],
        (
            ("wal_bytes", "-wal file, MiB", MIB),
            ("shm_bytes", "-shm file (the WAL's index), MiB", MIB),
        ),
    ),
}


# The database's side -----------------------------------------------------------------------


def mariadb_connect(database: str | None = None) -> Any:
    import MySQLdb

    host, port = Endpoints().addresses["mariadb"]
    kwargs: dict[str, Any] = {"database": database} if database else {}
    return MySQLdb.connect(
        host=host,
        port=port,
        user=os.environ.get("BENCH_MARIADB_USER", "root"),
        password=os.environ.get("BENCH_MARIADB_PASSWORD", ""),
        autocommit=True,
        **kwargs,
    )


class Database:
    """Where one target's run keeps its tables: created with the app's table, removed after."""

    def __init__(self, target: Target, work: Path, mariadb_database: str) -> None:
        self.target = target
        self.mariadb_database = mariadb_database
        self.sqlite_path = work / f"{DATABASE_NAME}.sqlite3"

    def create(self, accounts: int) -> None:
        if self.target.name == "mariadb":
            with mariadb_connect() as conn, conn.cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS `{self.mariadb_database}`")
                cursor.execute(f"CREATE DATABASE `{self.mariadb_database}`")
                cursor.execute(f"USE `{self.mariadb_database}`")
                cursor.execute("SET SESSION max_recursive_iterations = %s", (accounts + 1,))
                cursor.execute(MARIADB_SCHEMA)
                cursor.execute(MARIADB_FILL, (accounts,))
                cursor.execute(f"ANALYZE TABLE {app.TABLE}")
                cursor.fetchall()
            return
        conn = sqlite3.connect(self.sqlite_path, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(SQLITE_SCHEMA)
            conn.execute(SQLITE_FILL, (accounts,))
            conn.execute("ANALYZE")
        finally:
            conn.close()

    def drop(self) -> None:
        if self.target.name == "mariadb":
            with mariadb_connect() as conn, conn.cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS `{self.mariadb_database}`")

    def session(self) -> Callable[[str, float], int]:
        """An analytics session: hold a snapshot for ``seconds``; return the count it read."""
        if self.target.name == "mariadb":
            return self._mariadb_session
        return self._sqlite_session

    def _mariadb_session(self, name: str, seconds: float) -> int:
        conn = mariadb_connect(self.mariadb_database)
        try:
            cursor = conn.cursor()
            cursor.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            cursor.execute(app.ANALYTICS_READ)
            count = int(cursor.fetchone()[0])
            # The session's name in the statement's text: innodb_trx shows it (no
            # application_name on MariaDB).
            cursor.execute("SELECT SLEEP(%s), %s", (seconds, name))
            cursor.fetchall()
            conn.commit()
            return count
        finally:
            conn.close()

    def _sqlite_session(self, name: str, seconds: float) -> int:
        conn = sqlite3.connect(self.sqlite_path, isolation_level=None, timeout=20)
        try:
            conn.execute("BEGIN")
            count = int(conn.execute(app.ANALYTICS_READ).fetchone()[0])
            time.sleep(seconds)  # the read transaction stays open: its snapshot holds the WAL
            conn.execute("COMMIT")
            return count
        finally:
            conn.close()

    @staticmethod
    def wait_started(log_path: Path, worker: Any) -> None:
        """Until the worker says it started (its log), or fail."""
        deadline = time.monotonic() + READY_TIMEOUT
        while not (log_path.exists() and WORKER_STARTED in log_path.read_text(errors="replace")):
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited with {worker.returncode} at start")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the worker did not start within {READY_TIMEOUT:g} s")
            time.sleep(0.1)


class Sessions(holders.Analytics):
    """holders.Analytics' overlapping sessions, on MariaDB or SQLite."""

    def __init__(self, hold: Callable[[str, float], int], seconds: float, gap: float) -> None:
        super().__init__("", seconds, gap)
        self.hold = hold

    def _session(self, number: int, seconds: float) -> None:
        name = f"analytics-{number}"
        record: dict[str, Any] = {"name": name, "sleep_s": round(seconds, 3)}
        started = time.monotonic()
        try:
            record["count"] = self.hold(name, seconds)
        except Exception as e:  # the figure says so; the run goes on
            record["error"] = f"{e.__class__.__name__}: {e}"
        record["held_s"] = round(time.monotonic() - started, 3)
        self.sessions.append(record)


class Sampler(threading.Thread):
    """Once a second: the statements timed since the last sample, the database's gauges, the
    oldest transaction (MariaDB), the worker's CPU."""

    def __init__(self, target: Target, database: Database, events: Events, worker_pid: int):
        super().__init__(daemon=True)
        self.target = target
        self.database = database
        self.events = events
        self.worker_pid = worker_pid
        self.samples: list[dict[str, Any]] = []
        self.phase = "start"
        self._seen = 0  # statements of events.statements already in a sample
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._conn = (
            mariadb_connect(database.mariadb_database) if target.name == "mariadb" else None
        )

    def run(self) -> None:
        while not self._closing.wait(SAMPLE_EVERY):
            with self._lock:
                self._sample()

    def mark(self, phase: str) -> None:
        """End the current phase with a sample and start ``phase``."""
        with self._lock:
            self._sample()
            self.phase = phase

    def close(self) -> None:
        self._closing.set()
        self.join(timeout=5)
        with self._lock:
            if self._conn is not None:
                self._conn.close()

    def _sample(self) -> None:
        sample: dict[str, Any] = {
            "t": time.time(),
            "phase": self.phase,
            "load1": os.getloadavg()[0],
            "worker_cpu_s": tree_cpu_seconds(self.worker_pid),
        }
        # calls, ms, buffers (none known), max ms
        kinds = {kind: [0, 0.0, 0, 0.0] for kind, _ in self.target.kinds}
        names = [kind for kind, _ in self.target.kinds]
        statements = self.events.statements
        end = len(statements)
        for _at, index, seconds in statements[self._seen : end]:
            figures = kinds[names[index]]
            figures[0] += 1
            figures[1] += seconds * 1000
            figures[3] = max(figures[3], seconds * 1000)
        self._seen = end
        sample["statements"] = {
            kind: {"calls": c, "ms": ms, "buffers": b, "phase_max_ms": m}
            for kind, (c, ms, b, m) in kinds.items()
        }
        sample["gauges"], sample["horizon"] = self._gauges()
        self.samples.append(sample)

    def _gauges(self) -> tuple[dict[str, float | None], dict[str, Any]]:
        if self._conn is not None:
            with self._conn.cursor() as cursor:
                cursor.execute(HISTORY_SQL)
                (history,) = cursor.fetchone()
                cursor.execute(OLDEST_SQL)
                seconds, thread, query = cursor.fetchone() or (None, None, None)
            holder = None if thread is None else f"thread {thread}: {query or 'idle'}"
            horizon = {"seconds": None if seconds is None else float(seconds), "holder": holder}
            return {"history_length": int(history)}, horizon
        path = str(self.database.sqlite_path)
        return {
            "wal_bytes": _size(path + "-wal"),
            "shm_bytes": _size(path + "-shm"),
        }, {"seconds": None, "holder": None}


def _size(path: str) -> float | None:
    try:
        return float(os.path.getsize(path))
    except OSError:
        return None


# The run -------------------------------------------------------------------------------------


def main(args: argparse.Namespace, argv: list[str], profile: str, out: Path | None) -> int:
    """Run the profile on ``args.database`` (cli.main parsed and checked the arguments)."""
    target = TARGETS[args.database]
    out = out or (RESULTS_DIR if args.smoke else DOCS_DIR)
    processes.install_cleanup()
    os.environ.pop(CORE_PATH_ENV, None)  # the working tree's django_sqltasks
    os.environ["BENCH_MARIADB_DATABASE"] = args.mariadb_database
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    work = Path(tempfile.mkdtemp(prefix="bench-mixed-"))
    logs = RESULTS_DIR / f"{stamp}-{profile}-logs"
    meta: dict[str, Any] = {
        "profile": profile,
        "database": target.name,
        "command": " ".join(["python -m benchmarks mixed", *argv]),
        "started_at": stamp,
        "rate": args.rate,
        "hold": ["analytics"],
        "seconds": {"baseline": args.baseline, "held": args.held, "recovery": args.recovery},
        "session_s": args.session,
        "gap_s": args.gap,
        "concurrency": args.concurrency,
        "accounts": args.accounts,
        "uptime_before": _uptime(),
        **_commit(),
    }
    print(f"uptime: {meta['uptime_before']}", file=sys.stderr)
    result: dict[str, Any] = {"meta": meta, "systems": {}}
    database = Database(target, work, args.mariadb_database)
    try:
        log(f"{target.name}: creating the database")
        database.create(args.accounts)
        result["systems"][target.name] = run(target, database, args, work, logs, meta)
    except KeyboardInterrupt:
        log("interrupted: every process started is stopped")
        return 130
    finally:
        processes.stop_all()
        database.drop()
        shutil.rmtree(work, ignore_errors=True)
    meta["uptime_after"] = _uptime()
    print(f"uptime: {meta['uptime_after']}", file=sys.stderr)
    print(markdown(result))
    write(result, out)
    log(f"results: {out}; logs: {logs}")
    if args.smoke:
        from benchmarks.mixed.cli import _smoke_verdict

        return _smoke_verdict(result)
    return 0


def run(
    target: Target,
    database: Database,
    args: argparse.Namespace,
    work: Path,
    logs: Path,
    meta: dict[str, Any],
) -> dict[str, Any]:
    """One run: set up, load, hold, recover, drain."""
    endpoints = Endpoints(state_dir=str(work))
    manage(target.system, endpoints, "migrate", "--noinput", "-v", "0")
    meta["server_version"] = _version(target, database)
    events = Events()
    events.start()
    env = django_env(target.system, endpoints)
    env[timing.TIMING_ENV] = timing.env_value(events.port, target.kinds)
    worker_log = logs / f"{target.name}-worker.log"
    worker = processes.spawn(target.system.worker_argv(args.concurrency), env, worker_log)
    database.wait_started(worker_log, worker)
    time.sleep(SETTLE)
    sampler = Sampler(target, database, events, worker.pid)
    sampler.start()
    total = args.baseline + args.held + args.recovery
    times, figures = work / f"{target.name}-times", work / f"{target.name}-enqueuer.json"
    enqueuer = processes.spawn(
        [sys.executable, "-m", "benchmarks.mixed.enqueuer", "--system", "sqltasks",
         "--rate", str(args.rate), "--seconds", str(total),
         "--port", str(events.port), "--accounts", str(args.accounts),
         "--times", str(times), "--figures", str(figures)],
        env,
        logs / f"{target.name}-enqueuer.log",
    )  # fmt: skip
    sessions = Sessions(database.session(), args.session, args.gap)

    def hold(until: float, stopping: threading.Event) -> list[threading.Thread]:
        thread = threading.Thread(target=sessions.run, args=(until, stopping))
        thread.start()
        return [thread]

    bounds, enqueued = run_phases(args, worker, enqueuer, events, sampler, hold, times)
    # No hot table's dead rows here: the gauges stand for them.
    result = summary.system_figures(enqueued, events.tasks, sampler.samples, bounds, "")
    for name in bounds:
        in_phase = [s for s in sampler.samples if s["phase"] == name]
        result["phases"][name]["gauges"] = _gauge_figures(target, in_phase)
    key = target.gauges[0][0]
    result["series"]["dead"] = [s["gauges"].get(key) for s in sampler.samples]
    result |= {
        "label": target.label,
        "statement_kinds": dict(target.kinds),
        "enqueuer": json.loads(figures.read_text()),
        "holders": {"sessions": sessions.sessions},
        "worker_warnings": _warnings(logs / f"{target.name}-worker.log"),
    }
    return result


def _gauge_figures(target: Target, samples: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, _label, _divisor in target.gauges:
        values = [s["gauges"][key] for s in samples if s["gauges"].get(key) is not None]
        out[key] = {
            "max": max(values, default=None),
            "last": values[-1] if values else None,
        }
    return out


def _version(target: Target, database: Database) -> str:
    if target.name == "sqlite":
        return sqlite3.sqlite_version
    with mariadb_connect() as conn, conn.cursor() as cursor:
        cursor.execute("SELECT VERSION()")
        return str(cursor.fetchone()[0])


# The table and the chart ---------------------------------------------------------------------


def _statement(kind: str) -> Callable[[dict[str, Any]], str]:
    def cell(p: dict[str, Any]) -> str:
        figures = p.get(kind) or {}
        calls = summary._n(figures.get("calls_per_s"), 1)
        mean, most = summary._ms(figures.get("mean_ms")), summary._ms(figures.get("max_ms"))
        return f"{calls}; {mean} / {most}"

    return cell


def _gauge(key: str, divisor: float) -> Callable[[dict[str, Any]], str]:
    def cell(p: dict[str, Any]) -> str:
        figures = p.get("gauges", {}).get(key) or {}
        most, last = figures.get("max"), figures.get("last")
        if most is None:
            return "—"
        digits = 1 if divisor > 1 else 0
        return f"{summary._n(most / divisor, digits)}; {summary._n(last / divisor, digits)}"

    return cell


def rows(target: Target) -> list[tuple[str, Callable[[dict[str, Any]], str]]]:
    """The table's rows for ``target``: the PostgreSQL table's that apply, then its own."""
    keep = {
        "enqueued per s (achieved)",
        "backlog max (tasks due, not started); oldest waiting",
        "start latency p50 / p99; worst 10 s p99",
        "completed per s: mean; worst 10 s",
        "load average (1 min), min-max",
    }
    common = [(label, cell) for label, cell in summary.ROWS if label in keep]
    statements = [
        (f"{kind} statement: calls per s; mean / max", _statement(kind))
        for kind, _parts in target.kinds
    ]
    gauges = [(f"{label}: max; at the end", _gauge(k, d)) for k, label, d in target.gauges]
    tail: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        (
            "worker CPU per task",
            lambda p: summary._ms(p.get("worker_cpu_ms_per_task")),
        )
    ]
    if target.name == "mariadb":
        tail.insert(0, ("oldest transaction on this database, max age", summary._snapshot))
    return common[:-1] + statements + gauges + tail + common[-1:]


def markdown(result: dict[str, Any], heading: str = "###") -> str:
    meta = result["meta"]
    target = TARGETS[meta["database"]]
    system = result["systems"][target.name]
    lines = [
        f"{heading} Profile `{meta['profile']}`: {meta['rate']:g} tasks/s on {target.label}, "
        "snapshots held by analytics sessions",
        "",
        f"Command: `{meta['command']}`. Run {meta['started_at']} (UTC), django-sqltasks "
        f"{meta['commit'][:12]}{' with uncommitted changes' if meta.get('dirty') else ''}, "
        f"{'MariaDB' if target.name == 'mariadb' else 'SQLite'} {meta['server_version']}. "
        f"Phases: baseline {meta['seconds']['baseline']:g} s, snapshots held "
        f"{meta['seconds']['held']:g} s, recovery {meta['seconds']['recovery']:g} s; sessions "
        f"of {meta['session_s']:g} s, {meta['gap_s']:g} s apart; one worker at concurrency "
        f"{meta['concurrency']}. Statement times are the worker's and the enqueuer's own "
        f"(around the driver's call). `uptime` before and after: {meta['uptime_before']}; "
        f"{meta.get('uptime_after', '—')}.",
        "",
        f"**{system['label']}**"
        + (
            f": {system['lost']:,} tasks not started by the end of the drain"
            if system["lost"]
            else ""
        ),
        "",
        "| | " + " | ".join(summary.PHASE_LABELS[p] for p in summary.PHASES) + " |",
        "|---|" + "---|" * len(summary.PHASES),
    ]
    for label, cell in rows(target):
        lines.append(
            f"| {label} | " + " | ".join(cell(system["phases"][p]) for p in summary.PHASES) + " |"
        )
    lines.append("")
    sessions = system.get("holders", {}).get("sessions") or []
    if sessions:
        longest = max(s["held_s"] for s in sessions)
        errors = [s["error"] for s in sessions if "error" in s]
        lines.append(
            f"Analytics sessions: {len(sessions)}, the longest held {longest:.0f} s"
            + (f"; {len(errors)} failed: {errors[0]}" if errors else "")
            + "."
        )
    warnings = system.get("worker_warnings")
    lines.append(
        "Worker log: "
        + (
            ", ".join(f"{code} x{n}" for code, n in sorted(warnings.items()))
            if warnings
            else "no warning"
        )
        + "."
    )
    lines += ["", 'Issue 44\'s "done when" (written for PostgreSQL), measured:', ""]
    for what, figure, met in summary.checks(result, target.name):
        lines.append(f"- {'met' if met else 'NOT met'}: {what}: {figure}")
    lines.append("")
    return "\n".join(lines)


def write(result: dict[str, Any], out: Path) -> None:
    """The JSON, the table and the chart under ``out`` (docs/benchmarks.md is edited by hand:
    its sections on earlier runs are not in the results)."""
    out.mkdir(parents=True, exist_ok=True)
    name = result["meta"]["profile"]
    result["meta"]["chart"] = f"{name}.png"
    target = TARGETS[result["meta"]["database"]]
    key, label, _divisor = target.gauges[0]
    panels = [(k, lab, scale) for k, lab, scale in summary.PANELS]
    panels[2] = (
        "dead",
        label.split(",")[0] + (" (bytes)" if key.endswith("bytes") else ""),
        "linear",
    )
    summary.chart(result, out / f"{name}.png", panels)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
    (out / f"{name}.md").write_text(markdown(result))
