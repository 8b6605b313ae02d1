"""What the harness records while a system runs: every task's report, the enqueuer's progress,
and once a second the server's view (dead row versions, sizes, the statements' cost from
pg_stat_statements, the oldest snapshot) and the CPU time of the server's processes.

pg_stat_statements is reset at each phase boundary (``mark``), so a statement's ``max`` read at
the end of a phase is that phase's; the per-second figures are differences between samples.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import psutil
import psycopg

from benchmarks.metrics import tree_cpu_seconds
from benchmarks.mixed import app

SAMPLE_EVERY = 1.0  # seconds
TOP_STATEMENTS = 12  # statements kept per phase in the JSON, by total time, and by calls

TABLE_STATS = """
SELECT relname, n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count,
    pg_table_size(relid), pg_indexes_size(relid)
FROM pg_stat_user_tables WHERE relname = ANY(%s)
"""
STATEMENTS = """
SELECT queryid, query, calls, total_exec_time, max_exec_time,
    shared_blks_hit + shared_blks_read, shared_blks_read, total_plan_time, plans
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
# The oldest snapshot any session of this database holds: the horizon vacuum cannot pass.
HORIZON = """
SELECT max(age(backend_xmin)),
    extract(epoch FROM now() - min(xact_start) FILTER (WHERE backend_xmin IS NOT NULL))::float8,
    (array_agg(application_name ORDER BY xact_start) FILTER (WHERE backend_xmin IS NOT NULL))[1]
FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
"""
# Who each server process is: a client's application_name, or the server's own role.
PROCESSES = """
SELECT pid, CASE WHEN backend_type = 'client backend'
    THEN 'client: ' || coalesce(nullif(application_name, ''), '?') ELSE backend_type END
FROM pg_stat_activity
"""


class Events(threading.Thread):
    """The UDP socket every task, the enqueuer and the statement timer report to."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.settimeout(0.2)
        self.port = int(self.socket.getsockname()[1])
        self.tasks: list[tuple[int, float, float, float]] = []  # seq, enqueued, started, ended
        self.progress: list[tuple[int, float, float]] = []  # enqueued so far, at, slowest call
        # received at, kind, seconds: the statements timing.py times (MariaDB and SQLite runs)
        self.statements: list[tuple[float, int, float]] = []
        self._closing = threading.Event()

    def run(self) -> None:
        while not self._closing.is_set():
            try:
                data = self.socket.recv(64)
            except TimeoutError:
                continue
            if len(data) == app.TASK_EVENT.size:
                self.tasks.append(app.TASK_EVENT.unpack(data))
            elif len(data) == app.PROGRESS_EVENT.size:
                self.progress.append(app.PROGRESS_EVENT.unpack(data))
            elif len(data) == app.STATEMENT_EVENT.size:
                self.statements.append((time.time(), *app.STATEMENT_EVENT.unpack(data)))

    def close(self) -> None:
        self._closing.set()
        self.join(timeout=2)
        self.socket.close()


class Sampler(threading.Thread):
    """Once a second: the tables, the statements by kind, the horizon, the CPU."""

    def __init__(
        self,
        url: str,
        tables: list[str],  # [the queue's hot table, the app's table]
        kinds: dict[str, str],  # statement kind -> a substring of its text
        postmaster: int,
        worker_pid: int | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.tables = tables
        self.kinds = kinds
        self.postmaster = postmaster
        self.worker_pid = worker_pid
        self.samples: list[dict[str, Any]] = []
        self.top: dict[str, list[dict[str, Any]]] = {}  # phase -> its costliest statements
        self.phase = "start"
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._conn = psycopg.connect(url, autocommit=True, application_name="sampler")
        self._conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self._conn.execute("SELECT pg_stat_statements_reset()")
        self._previous: dict[int, tuple[int, float, int, int]] = {}
        # The server's CPU by process, this phase: pid -> [its role, CPU seconds at its first
        # sample in the phase, at its last]; per phase, each role's CPU seconds.
        self._processes: dict[int, list[Any]] = {}
        self.cpu_by_role: dict[str, dict[str, float]] = {}

    def run(self) -> None:
        while not self._closing.wait(SAMPLE_EVERY):
            with self._lock:
                self._sample()

    def mark(self, phase: str) -> None:
        """End the current phase with a sample and start ``phase``."""
        with self._lock:
            self._sample()
            rows = self._conn.execute(STATEMENTS).fetchall()
            self.top[self.phase] = _top(rows)
            self.top[f"{self.phase} by calls"] = _top(rows, by_calls=True)
            self._conn.execute("SELECT pg_stat_statements_reset()")
            self._previous = {}
            roles: dict[str, float] = {}
            for role, first, last in self._processes.values():
                roles[role] = roles.get(role, 0.0) + last - first
            self.cpu_by_role[self.phase] = dict(sorted(roles.items(), key=lambda r: -r[1]))
            self._processes = {}
            self.phase = phase

    def close(self) -> None:
        self._closing.set()
        self.join(timeout=5)
        with self._lock:
            self._conn.close()

    def _sample(self) -> None:
        sample: dict[str, Any] = {
            "t": time.time(),
            "phase": self.phase,
            "load1": os.getloadavg()[0],
            "server_cpu_s": server_cpu_seconds(self.postmaster),
        }
        if self.worker_pid is not None:
            sample["worker_cpu_s"] = tree_cpu_seconds(self.worker_pid)
        self._sample_processes()
        for name, live, dead, vacuums, analyzes, size, indexes in self._conn.execute(
            TABLE_STATS, (self.tables,)
        ).fetchall():
            sample[name] = {
                "live": live,
                "dead": dead,
                "autovacuums": vacuums,
                "autoanalyzes": analyzes,
                "table_bytes": size,
                "index_bytes": indexes,
            }
        xid_age, seconds, holder = self._conn.execute(HORIZON).fetchone() or (None, None, None)
        sample["horizon"] = {"xid_age": xid_age, "seconds": seconds, "holder": holder}
        kinds = {kind: [0, 0.0, 0, 0.0] for kind in self.kinds}  # calls, ms, buffers, max ms
        for queryid, query, calls, total, most, buffers, *_rest in self._conn.execute(
            STATEMENTS
        ).fetchall():
            before = self._previous.get(queryid, (0, 0.0, 0, 0))
            if calls < before[0]:  # reset since: all of it is new
                before = (0, 0.0, 0, 0)
            self._previous[queryid] = (calls, total, buffers, 0)
            for kind, text in self.kinds.items():
                if text in query:
                    figures = kinds[kind]
                    figures[0] += calls - before[0]
                    figures[1] += total - before[1]
                    figures[2] += buffers - before[2]
                    figures[3] = max(figures[3], most)  # the phase's, so far
        sample["statements"] = {
            kind: {"calls": c, "ms": ms, "buffers": b, "phase_max_ms": m}
            for kind, (c, ms, b, m) in kinds.items()
        }
        self.samples.append(sample)


    def _sample_processes(self) -> None:
        """Each server process's CPU so far (a process that ends between two samples takes
        its last second with it: the phase's total, server_cpu_s, still counts it)."""
        for pid, role in self._conn.execute(PROCESSES).fetchall():
            try:
                times = psutil.Process(pid).cpu_times()
            except psutil.Error:
                continue
            seen = self._processes.setdefault(pid, [role, times.user + times.system, 0.0])
            seen[0], seen[2] = role, times.user + times.system


def _top(rows: list[tuple[Any, ...]], by_calls: bool = False) -> list[dict[str, Any]]:
    def cost(row: tuple[Any, ...]) -> float:
        return float(row[2]) if by_calls else float(row[3] + row[7])

    ordered = sorted(rows, key=cost, reverse=True)[:TOP_STATEMENTS]
    return [
        {
            "query": " ".join(query.split())[:200],
            "calls": calls,
            "mean_ms": round(total / calls, 3) if calls else None,
            "max_ms": round(most, 3),
            "buffers_per_call": round(buffers / calls, 1) if calls else None,
            "read_per_call": round(read / calls, 2) if calls else None,
            # Planning: only with pg_stat_statements.track_planning on (--pg-setting).
            "plans": plans,
            "plan_mean_ms": round(planning / plans, 3) if plans else None,
        }
        for _id, query, calls, total, most, buffers, read, planning, plans in ordered
    ]


def server_cpu_seconds(postmaster: int) -> float:
    """User plus system CPU of the server: its processes running now, and those the postmaster
    has reaped (its cutime and cstime: a session that ended)."""
    try:
        reaped = psutil.Process(postmaster).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return reaped.children_user + reaped.children_system + tree_cpu_seconds(postmaster)
