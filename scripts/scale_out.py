"""Scale-out on one PostgreSQL: 1, 2 and 4 worker processes draining the same queue.

Each worker is a separate ``tasks_worker`` process, as on separate machines (no supervisor):
they share nothing but the database. For each count of workers and each workload, the workers
start and go idle, N tasks are enqueued in one transaction (``enqueue_many``: COPY), and the
clock runs from that commit until every task is SUCCESSFUL (read every 20 ms with one indexed
count). Reported: aggregate tasks/s, and the CPU time per task of the PostgreSQL server (every
``postgres`` process, from /proc: the database's share of the work) and of the workers. Usage:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/sqltasks_scale \\
        python scripts/scale_out.py [--tasks 20000] [--workers 1,2,4] [--repeat 2]

The table is truncated and vacuumed before each run. Linux only (it reads /proc).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")
WORKLOADS = {"noop": ("noop", "[((), {})] * n"), "sleep10": ("sleep", "[((0.01,), {})] * n")}


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU time of ``pids`` (those that still exist)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def postgres_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def django(env: dict[str, str], code: str) -> str:
    script = "import django; django.setup()\n" + code
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True)
    if done.returncode:
        sys.exit(done.stderr.decode())
    return done.stdout.decode()


def run(env: dict[str, str], workers: int, workload: str, tasks: int) -> dict[str, float]:
    name, calls = WORKLOADS[workload]
    django(
        env,
        "from django.db import connection\n"
        "with connection.cursor() as c:\n"
        "    c.execute('TRUNCATE django_sqltasks_taskrecord')\n"
        "    c.execute('VACUUM ANALYZE django_sqltasks_taskrecord')\n",
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "django", "tasks_worker", "-v", "0", "--concurrency", "100"],
            env=env,
            cwd=ROOT,
        )
        for _ in range(workers)
    ]
    try:
        time.sleep(3.0)  # start-up is not measured: each worker is idle by now
        database_before = cpu_seconds(postgres_pids())
        workers_before = cpu_seconds([p.pid for p in procs])
        out = django(
            env,
            f"import time\nfrom tests.tasks import {name}\nn = {tasks}\ncalls = {calls}\n"
            "from django_sqltasks.compat import task_backends\n"
            f"task_backends['default'].enqueue_many({name}, calls)\nprint(time.time())\n"
            "from django_sqltasks.models import TaskRecord\n"
            "while TaskRecord.objects.succeeded().count() < n:\n"
            "    time.sleep(0.02)\n"
            "print(time.time())\n",
        )
        committed, finished = map(float, out.split())
        database = cpu_seconds(postgres_pids()) - database_before
        worker = cpu_seconds([p.pid for p in procs]) - workers_before
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
    seconds = finished - committed
    return {
        "rate": tasks / seconds,
        "db_ms": database / tasks * 1000,
        "worker_ms": worker / tasks * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--workloads", default="noop,sleep10")
    parser.add_argument("--repeat", type=int, default=2)
    options = parser.parse_args()
    env = dict(os.environ)
    if not env.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("Set DATABASE_URL to a PostgreSQL database (it is truncated).")
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["SQLTASKS_POLL_INTERVAL"] = "1"  # the default a project has
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v0"], env=env, cwd=ROOT, check=True
    )
    counts = [int(c) for c in options.workers.split(",")]
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for _ in range(options.repeat):  # interleaved: each repeat runs every configuration once
        for workload in options.workloads.split(","):
            for workers in counts:
                result = run(env, workers, workload, options.tasks)
                results.setdefault((workload, workers), []).append(result)
                print(f"{workload} x{workers}: {result}", flush=True)
    print(
        "\n| workload | worker processes | tasks/s (median) | DB CPU ms/task | worker CPU ms/task |"
    )
    print("|---|---|---|---|---|")
    for (workload, workers), runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"| {workload} | {workers} | {med['rate']:,.0f} | {med['db_ms']:.3f} "
            f"| {med['worker_ms']:.3f} |"
        )


if __name__ == "__main__":
    main()
