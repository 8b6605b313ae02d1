"""Soak run: many tasks through several workers, with SIGKILLs and a database restart.

Out of CI; see docs/reliability.md. By default it starts a private PostgreSQL server (so the
restart hurts no one) and runs 1,000,000 tasks through 4 workers:

    .venv/bin/python scripts/soak.py --tasks 100000          # a reduced run
    .venv/bin/python scripts/soak.py --json soak.json        # the full run, figures saved

Each task appends its label to a file; afterwards every label must be there (lost = 0), and
every label seen twice must belong to a row whose errors say why it ran again.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.gauntlet_postgres import PrivatePostgres, find_bindir  # noqa: E402

TABLE = "django_sqltasks_taskrecord"
ENQUEUE_CHUNK = 10_000  # tasks per enqueue_many (one COPY on PostgreSQL)
CLAIM_SAMPLE = 5_000  # tasks claimed to measure claim speed
CLAIM_BATCH = 50  # tasks per claim statement in that measurement
CLAIM_ROUNDS = 5  # rounds of that measurement; the median is reported
PROBE_QUEUE = "soak-probe"  # a queue no soak worker runs: the claim-time probe's own tasks
PROBE_CLAIMS = 20  # claims of CLAIM_BATCH timed by one probe; the median is reported


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class Executions:
    """Follow the executions file: labels, counted incrementally."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.count = 0

    def poll(self) -> int:
        if self.path.exists():
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
            whole = data.rfind(b"\n") + 1
            self.offset += whole
            self.count += data[:whole].count(b"\n")
        return self.count

    def labels(self) -> Counter[str]:
        return Counter(line.split()[0] for line in self.path.read_text().splitlines())


class Workers:
    """Worker subprocesses; a killed one is replaced by a new one with a new id."""

    def __init__(self, count: int, concurrency: int, env: dict[str, str], logdir: Path) -> None:
        self.env = env
        self.concurrency = concurrency
        self.logdir = logdir
        self.generation = 0
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        for _ in range(count):
            self.spawn()

    def spawn(self) -> None:
        self.generation += 1
        worker_id = f"soak-{self.generation}"
        out = (self.logdir / f"{worker_id}.log").open("wb")
        self.procs[worker_id] = subprocess.Popen(
            [sys.executable, "-m", "django", "tasks_worker", "--worker-id", worker_id,
             "--concurrency", str(self.concurrency)],
            cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def kill_one(self) -> str:
        worker_id = random.choice(sorted(self.procs))
        proc = self.procs.pop(worker_id)
        proc.kill()
        proc.wait()
        self.spawn()
        return worker_id

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def django_setup(url: str, lease: float) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["SQLTASKS_LEASE_TIMEOUT"] = str(lease)
    os.environ["SQLTASKS_HEARTBEAT_INTERVAL"] = str(lease / 5)
    import django

    django.setup()


def scalar(sql: str, params: list[Any] | None = None) -> Any:
    """Run ``sql``, riding out the restart like a worker does; return the first value."""
    from django.db import connection

    from django_sqltasks.worker.retries import run_with_retries

    def run() -> Any:
        with connection.cursor() as cursor:
            cursor.execute(sql, params or [])
            row = cursor.fetchone() if cursor.description else None
        return row[0] if row else None

    return run_with_retries("default", run)


def enqueue(log_path: Path, count: int) -> float:
    from tests import gauntlet_tasks

    backend = gauntlet_tasks.mark.get_backend()
    started = time.monotonic()
    for start in range(0, count, ENQUEUE_CHUNK):
        calls: list[tuple[tuple[str, str], dict[str, Any]]] = [
            ((str(log_path), f"t{i}"), {}) for i in range(start, min(count, start + ENQUEUE_CHUNK))
        ]
        backend.enqueue_many(gauntlet_tasks.mark, calls)  # type: ignore[attr-defined]
    return time.monotonic() - started


def claim_rate(queue_names: list[str] | None = None) -> float:
    """Claim CLAIM_SAMPLE fresh tasks, CLAIM_BATCH at a time; return tasks claimed per second.

    ``queue_names=None`` is a worker on every queue (``--queue '*'``).
    """
    from django.db import connection

    from django_sqltasks.sql import dialect_for
    from tests import tasks

    backend = tasks.noop.get_backend()
    backend.enqueue_many(tasks.noop, [((), {})] * CLAIM_SAMPLE)  # type: ignore[attr-defined]
    dialect = dialect_for(connection)
    if connection.vendor == "postgresql":
        scalar(f"ANALYZE {TABLE}")
    claimed = 0
    started = time.perf_counter()
    with connection.cursor() as cursor:
        while claimed < CLAIM_SAMPLE:
            rows = dialect.claim(
                cursor, backend_name="default", queue_names=queue_names, worker_id="claim-bench",
                limit=CLAIM_BATCH,
            )  # fmt: skip
            if not rows:
                break
            claimed += len(rows)
    elapsed = time.perf_counter() - started
    scalar(f"DELETE FROM {TABLE} WHERE owner = %s", ["claim-bench"])
    return claimed / elapsed


def idle_claim_probe(executed: int) -> dict[str, Any]:
    """claim_probe with no worker running: the median of CLAIM_ROUNDS probes (one is noisy)."""
    probes = [claim_probe() for _ in range(CLAIM_ROUNDS)]
    return {
        "executed": executed,
        "workers": "idle",
        **probes[-1],
        "claim_ms": statistics.median(p["claim_ms"] for p in probes),
        "claim_ms_rounds": [p["claim_ms"] for p in probes],
    }


def claim_probe() -> dict[str, Any]:
    """Time PROBE_CLAIMS claims of CLAIM_BATCH tasks on a queue of their own, as the table is now.

    The probe's tasks are written straight into the table (the soak's QUEUES do not list the
    probe's queue, and its workers do not run it), so the probe runs beside a live soak without
    taking its tasks; what it measures is the claim over the table and indexes the run has left,
    while the workers share the machine. Returns the median claim in ms and the table's state.
    """
    from django.db import connection

    from django_sqltasks.sql import dialect_for

    count = PROBE_CLAIMS * CLAIM_BATCH
    scalar(
        f"""
        INSERT INTO {TABLE} (id, task_path, backend_name, queue_name, priority, status, args,
            kwargs, errors, worker_ids, attempts, enqueued_at, available_at)
        SELECT gen_random_uuid(), 'tests.tasks.noop', 'default', %s, 0, 'READY', '[]', '{{}}',
            '[]', '[]', 0, now(), now()
        FROM generate_series(1, %s)
        """,
        [PROBE_QUEUE, count],
    )
    dialect = dialect_for(connection)
    times: list[float] = []
    with connection.cursor() as cursor:
        for _ in range(PROBE_CLAIMS):
            started = time.perf_counter()
            rows = dialect.claim(
                cursor, backend_name="default", queue_names=[PROBE_QUEUE], worker_id="claim-probe",
                limit=CLAIM_BATCH,
            )  # fmt: skip
            times.append(time.perf_counter() - started)
            if len(rows) < CLAIM_BATCH:
                break
    scalar(f"DELETE FROM {TABLE} WHERE queue_name = %s", [PROBE_QUEUE])
    stats = _rows(
        "SELECT n_live_tup, n_dead_tup, autovacuum_count, pg_total_relation_size(relid)"
        f" FROM pg_stat_user_tables WHERE relname = '{TABLE}'"
    )[0]
    return {
        "claim_ms": round(statistics.median(times) * 1000, 2),
        "live_tuples": stats[0],
        "dead_tuples": stats[1],
        "autovacuums": stats[2],
        "total_mb": round(stats[3] / 2**20, 1),
    }


def claim_rates(vacuum: bool = True) -> dict[str, int]:
    """Median of CLAIM_ROUNDS interleaved rounds per kind of worker (one round is noisy);
    each round after a VACUUM ANALYZE, unless ``vacuum`` is false (the table as it is)."""
    rates: dict[str, list[float]] = {"wildcard": [], "one_queue": []}
    for _ in range(CLAIM_ROUNDS):
        if vacuum:
            _rows(f"VACUUM ANALYZE {TABLE}")
        rates["wildcard"].append(claim_rate())
        rates["one_queue"].append(claim_rate(["default"]))
    return {kind: round(statistics.median(values)) for kind, values in rates.items()}


def fill_finished(count: int) -> None:
    """Insert ``count`` SUCCESSFUL rows in one statement (PostgreSQL), as a finished soak leaves."""
    scalar(
        f"""
        INSERT INTO {TABLE} (id, task_path, backend_name, queue_name, priority, status, args,
            kwargs, errors, worker_ids, attempts, enqueued_at, available_at, started_at,
            last_attempted_at, finished_at, return_value)
        SELECT gen_random_uuid(), 'tests.gauntlet_tasks.mark', 'default', 'default', 0,
            'SUCCESSFUL', jsonb_build_array('/dev/null', 't' || i), '{{}}', '[]', '["w"]', 1,
            now(), now(), now(), now(), now(), to_jsonb('t' || i)
        FROM generate_series(1, %s) AS i
        """,
        [count],
    )
    _rows(f"VACUUM ANALYZE {TABLE}")


def claim_only(url: str, finished: int) -> dict[str, Any]:
    """Claim speed on an empty table against one holding ``finished`` finished rows."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    scalar(f"DELETE FROM {TABLE}")
    _rows(f"VACUUM ANALYZE {TABLE}")
    empty = claim_rates()
    fill_finished(finished)
    full = claim_rates()
    return {
        "finished_rows": finished,
        "claim_per_s_empty": empty,
        "claim_per_s_full": full,
        "full_vs_empty": {k: round(full[k] / empty[k], 2) for k in empty},
    }


def table_figures() -> dict[str, Any]:
    from django.db import connection

    if connection.vendor != "postgresql":
        return {}
    scalar(f"ANALYZE {TABLE}")
    return {
        "rows": scalar(f"SELECT count(*) FROM {TABLE}"),
        "table_mb": round(scalar("SELECT pg_relation_size(%s)", [TABLE]) / 2**20, 1),
        "indexes_mb": round(scalar("SELECT pg_indexes_size(%s)", [TABLE]) / 2**20, 1),
        "total_mb": round(scalar("SELECT pg_total_relation_size(%s)", [TABLE]) / 2**20, 1),
        "dead_tuples": scalar(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = %s", [TABLE]
        ),
    }


def duplicates_and_causes(labels: Counter[str]) -> dict[str, Any]:
    from django.db import connection

    twice = {label for label, n in labels.items() if n > 1}
    causes: Counter[str] = Counter()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT args, errors FROM {TABLE} WHERE attempts > 1")
        retried = {}
        for args, errors in cursor.fetchall():
            args = json.loads(args) if isinstance(args, str) else args
            errors = json.loads(errors) if isinstance(errors, str) else errors
            retried[args[1]] = [e["exception_class_path"].rsplit(".", 1)[-1] for e in errors]
    for label in twice:
        causes["+".join(retried.get(label, [])) or "UNEXPLAINED"] += 1
    return {
        "duplicated": len(twice),
        "extra_executions": sum(n - 1 for n in labels.values() if n > 1),
        "causes": dict(causes),
        "rows_attempted_more_than_once": len(retried),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--kill-every", type=float, default=15.0, help="seconds between SIGKILLs")
    parser.add_argument("--restart-at", type=float, default=0.5, help="restart at this fraction")
    parser.add_argument("--lease", type=float, default=5.0, help="LEASE_TIMEOUT, seconds")
    parser.add_argument("--database-url", help="an existing database (no restart); default: a "
                        "private PostgreSQL server")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--probe-every", type=int, default=0, metavar="TASKS",
        help="time the claim (PostgreSQL) every TASKS executions, and before and after the run",
    )  # fmt: skip
    parser.add_argument(
        "--claim-only", type=int, metavar="ROWS",
        help="only compare claim speed: empty table vs ROWS finished rows (PostgreSQL)",
    )  # fmt: skip
    args = parser.parse_args()

    server = None
    if args.database_url is None:
        bindir = find_bindir()
        if bindir is None:
            parser.error("no PostgreSQL binaries: pass --database-url")
        server = PrivatePostgres(bindir, "soak").init()
    url = args.database_url or server.url  # type: ignore[union-attr]
    workdir = Path(tempfile.mkdtemp(prefix="sqltasks-soak-"))
    executions_path = workdir / "executions"
    figures: dict[str, Any] = {"tasks": args.tasks, "workers": args.workers}
    try:
        django_setup(url, args.lease)
        if args.claim_only:
            figures = claim_only(url, args.claim_only)
            print(json.dumps(figures, indent=2))
            if args.json:
                args.json.write_text(json.dumps(figures, indent=2) + "\n")
            return 0
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        scalar(f"DELETE FROM {TABLE}")
        figures["claim_per_s_empty"] = claim_rates()
        seconds = enqueue(executions_path, args.tasks)
        figures["enqueue_per_s"] = round(args.tasks / seconds)
        log(f"enqueued {args.tasks} in {seconds:.1f}s")
        probes: list[dict[str, Any]] = []
        probing = bool(args.probe_every) and _vendor() == "postgresql"
        if probing:
            figures["autovacuum"] = scalar("SHOW autovacuum")
            probes.append(idle_claim_probe(0))
            log(f"claim probe before the run: {probes[-1]}")

        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop("SQLTASKS_TEST_DB_NAME", None)
        executions = Executions(executions_path)
        started = last_kill = time.monotonic()
        workers = Workers(args.workers, args.concurrency, env, workdir)
        kills: list[str] = []
        restarts: list[dict[str, float]] = []
        samples: list[tuple[float, int]] = []
        while True:
            time.sleep(1.0)
            now = time.monotonic()
            done = executions.poll()
            samples.append((round(now - started, 1), done))
            if len(samples) % 10 == 0:
                log(f"{done} executions, {done / (now - started):.0f}/s overall")
            if probing and done < args.tasks and done >= args.probe_every * len(probes):
                probes.append({"executed": done, "workers": "running", **claim_probe()})
                log(f"claim probe: {probes[-1]}")
            if (
                done >= args.tasks
                and scalar(f"SELECT count(*) FROM {TABLE} WHERE status = 'SUCCESSFUL'")
                >= args.tasks
            ):
                break
            if now - started > args.timeout:
                log("timeout")
                break
            if args.kill_every and now - last_kill >= args.kill_every and done < args.tasks:
                kills.append(workers.kill_one())
                last_kill = now
                log(f"SIGKILL {kills[-1]}")
            if server is not None and not restarts and done >= args.tasks * args.restart_at:
                successful = f"SELECT count(*) FROM {TABLE} WHERE status = 'SUCCESSFUL'"
                t0 = time.monotonic()
                server.restart()
                down = time.monotonic() - t0
                # Recovered once a worker has written an outcome through a new connection.
                before = scalar(successful)
                while before < args.tasks and scalar(successful) <= before:
                    time.sleep(0.05)
                restarts.append(
                    {"down_s": round(down, 2), "resumed_s": round(time.monotonic() - t0, 2)}
                )
                resumed = restarts[-1]["resumed_s"]
                log(f"PostgreSQL restarted: down {down:.2f}s, work resumed after {resumed}s")
        elapsed = time.monotonic() - started
        workers.stop()

        labels = executions.labels()
        statuses = dict(_rows(f"SELECT status, count(*) FROM {TABLE} GROUP BY status"))
        lost = args.tasks - len(labels) + (args.tasks - statuses.get("SUCCESSFUL", 0))
        figures.update(
            elapsed_s=round(elapsed, 1),
            throughput_per_s=round(args.tasks / elapsed),
            kills=len(kills),
            restarts=restarts,
            statuses=statuses,
            lost=lost,
            **duplicates_and_causes(labels),
            throughput_over_time=_per_interval(samples, 10),
        )
        figures["table"] = table_figures()
        if probing:
            probes.append(idle_claim_probe(len(labels)))
            log(f"claim probe after the run: {probes[-1]}")
            figures["claim_probes"] = probes
            figures["claim_probe_end_vs_start"] = round(
                probes[-1]["claim_ms"] / probes[0]["claim_ms"], 2
            )
        figures["claim_per_s_full_unvacuumed"] = claim_rates(vacuum=False)
        if _vendor() == "postgresql":
            _rows(f"VACUUM ANALYZE {TABLE}")  # Django runs in autocommit here
        figures["claim_per_s_full"] = claim_rates()
        figures["table_after_vacuum"] = table_figures()
        figures["claim_full_vs_empty"] = {
            k: round(figures["claim_per_s_full"][k] / figures["claim_per_s_empty"][k], 2)
            for k in figures["claim_per_s_empty"]
        }
        print(json.dumps(figures, indent=2))
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2) + "\n")
        return 0 if lost == 0 and "UNEXPLAINED" not in figures["causes"] else 1
    finally:
        from django.db import connections

        connections.close_all()
        if server is not None:
            server.stop()


def _rows(sql: str) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql)
        return list(cursor.fetchall()) if cursor.description else []


def _vendor() -> str:
    from django.db import connection

    return connection.vendor


def _per_interval(samples: list[tuple[float, int]], every: int) -> list[dict[str, float]]:
    """Throughput per ``every`` samples (about ``every`` seconds)."""
    out = []
    for i in range(every, len(samples), every):
        (t0, n0), (t1, n1) = samples[i - every], samples[i]
        out.append({"t": t1, "per_s": round((n1 - n0) / (t1 - t0))})
    return out


if __name__ == "__main__":
    sys.exit(main())
