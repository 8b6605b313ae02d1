"""Where the enqueue-to-start latency goes, step by step, on PostgreSQL (or SQLite).

An idle worker (its own process, the default POLL_INTERVAL of 1 s) and an enqueuer (another
process) that sends one task at a time with a sync ``enqueue()``, at random gaps. The worker's
process is the real ``tasks_worker`` with timestamps taken where each step ends: the wake-up
(``Producer.woken_here`` on the loop where PostgreSQL listens there, else ``Producer.on_wake`` on
the listening thread), the loop acting on it, the claim's start and end (on the loop, or through
the database thread), and the task's first line. The enqueuer stamps the call's start and
return. Every stamp is ``time.time()`` on this one machine. Printed: the median of each step from
the call (the enqueue() call's own duration apart: the worker may be woken before it returns,
since it sends task_enqueued after the commit), the total, and what the statements cost on
this machine, each back to back and after 50-100 ms of idleness as the probes come: a ``SELECT
1`` round trip, a one-row INSERT committed with ``synchronous_commit`` on and off (the WAL
flush), the sync ``enqueue()``, and, on PostgreSQL, the worker's claim (its walk over priorities)
against a claim of the one task by its id, with ``synchronous_commit`` on and off. Usage:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/sqltasks_latency \\
        python scripts/latency_profile.py [--probes 200]

The task table of that database is emptied first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKER = textwrap.dedent(
    """
    import inspect, os, sys, time
    import django
    django.setup()
    from django_sqltasks.worker import producer

    LOG = open(os.environ["PROFILE_LOG"], "a", buffering=1)

    def mark(name):
        LOG.write(f"{name} {time.time():.6f}\\n")

    def wrap(cls, name, start, end=None):
        original = getattr(cls, name)
        if inspect.iscoroutinefunction(original):
            async def wrapper(self, *args):
                mark(start)
                result = await original(self, *args)
                if end and result:
                    mark(end)
                return result
        else:
            def wrapper(self, *args):
                mark(start)
                return original(self, *args)
        setattr(cls, name, wrapper)

    # PostgreSQL wakes the loop itself (woken_here); elsewhere a thread does (on_wake).
    wrap(producer.Producer, "on_wake", "woken_by_notify")
    wrap(producer.Producer, "woken_here", "woken_by_notify")
    wrap(producer.Producer, "_woken", "loop_acts")
    wrap(producer.Producer, "_claim_rows", "claim_start", "claim_end")
    from django.core.management import call_command
    call_command("tasks_worker", "--concurrency", "10", "-v", "0")
    """
)

ENQUEUER = textwrap.dedent(
    """
    import os, random, socket, time
    import django
    django.setup()
    from tests.tasks import probe_latency
    LOG = open(os.environ["PROFILE_LOG"], "a", buffering=1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    rng = random.Random(7)
    probe_latency.enqueue(port)  # the worker is up and idle after this one
    sock.recv(64)
    for _ in range(int(os.environ["PROBES"])):
        time.sleep(rng.uniform(0.05, 0.15))
        LOG.write(f"enqueue_call {time.time():.6f}\\n")
        probe_latency.enqueue(port)
        LOG.write(f"enqueue_returned {time.time():.6f}\\n")
        LOG.write(f"task_started {float(sock.recv(64)):.6f}\\n")
    """
)

STEPS = (
    "woken_by_notify",
    "loop_acts",
    "claim_start",
    "claim_end",
    "task_started",
)


def segments(log: Path) -> dict[str, list[float]]:
    """Milliseconds from each step to the next, per probe, from the stamps in ``log``."""
    events = sorted(
        (float(stamp), name)
        for name, stamp in (line.split() for line in log.read_text().splitlines())
    )
    result: dict[str, list[float]] = {}
    probe: dict[str, float] | None = None
    for at, name in events:
        if name == "enqueue_call":
            probe = {name: at}
        elif probe is not None and name == "enqueue_returned":
            probe[name] = at  # the notification may come first: enqueue() sends signals after
        elif probe is not None and name in STEPS and name not in probe:
            # Only in order: a poll's claim that began before the wake-up is not this one's.
            if any(step not in probe for step in STEPS[: STEPS.index(name)]):
                continue
            probe[name] = at
            if name == "task_started":
                if all(step in probe for step in (*STEPS, "enqueue_returned")):
                    call = probe["enqueue_returned"] - probe["enqueue_call"]
                    result.setdefault("enqueue() call", []).append(call * 1000)
                    previous = probe["enqueue_call"]
                    for step in STEPS:
                        result.setdefault(step, []).append((probe[step] - previous) * 1000)
                        previous = probe[step]
                    total = (probe["task_started"] - probe["enqueue_call"]) * 1000
                    result.setdefault("total", []).append(total)
                probe = None
    return result


def server_costs(env: dict[str, str]) -> str:
    code = textwrap.dedent(
        """
        import random, statistics, time
        import django
        django.setup()
        from django.db import connection
        from django_sqltasks.sql import UNLIMITED, dialect_for
        from tests.tasks import probe_latency

        def median(run, n=100, idle=False):
            # Back to back, or each after 50-100 ms of idleness, as the probes come.
            times = []
            for _ in range(n):
                prepare = run()
                if idle:
                    time.sleep(random.uniform(0.05, 0.1))
                t = time.perf_counter(); prepare(); times.append(time.perf_counter() - t)
            return statistics.median(times) * 1000

        def statement(sql, params=()):
            def run():
                return lambda: cursor.execute(sql, params)
            return run

        def show(name, run):
            print(f"{name}: {median(run):.3f} ms back to back, "
                  f"{median(run, idle=True):.3f} ms after 50-100 ms idle")

        dialect = dialect_for(connection)
        with connection.cursor() as cursor:
            show("SELECT 1 round trip", statement("SELECT 1"))
            if connection.vendor == "postgresql":
                # Not a TEMP table: those write no WAL, so their commits flush nothing.
                cursor.execute("CREATE TABLE IF NOT EXISTS sqltasks_commit_probe (x int)")
                for mode in ("on", "off"):
                    cursor.execute(f"SET synchronous_commit = {mode}")
                    show(f"one-row INSERT, synchronous_commit={mode}",
                         statement("INSERT INTO sqltasks_commit_probe VALUES (1)"))
                cursor.execute("DROP TABLE sqltasks_commit_probe")
            show("enqueue()", lambda: lambda: probe_latency.enqueue(1))
            if connection.vendor == "postgresql":
                # The claim as the worker runs it (the walk over priorities), and the same
                # claim of one task named by its id: one due task each time.
                walk, walk_params = dialect.claim_sql(
                    backend_name="default", queue_names=None, worker_id="p", limit=10
                )
                where, where_params = dialect._ready_where("default", None, UNLIMITED)
                by_id = (
                    f"WITH picked AS (SELECT id FROM {dialect.tasks} WHERE id = %s AND {where} "
                    "AND available_at <= now() FOR UPDATE SKIP LOCKED), claimed AS"
                    + walk.split("), claimed AS")[1]
                )
                def claim_walk():
                    probe_latency.enqueue(1)
                    return lambda: cursor.execute(walk, walk_params)
                def claim_id():
                    task = probe_latency.enqueue(1)
                    return lambda: cursor.execute(by_id, [task.id, *where_params, "p", "p"])
                for mode in ("on", "off"):
                    cursor.execute(f"SET synchronous_commit = {mode}")
                    show(f"claim, walk over priorities, synchronous_commit={mode}", claim_walk)
                    show(f"claim by id, synchronous_commit={mode}", claim_id)
            cursor.execute(f"DELETE FROM {dialect.tasks}")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True)
    if done.returncode:
        raise SystemExit(f"measuring the statements failed:\n{done.stderr.decode()}")
    return done.stdout.decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, default=200)
    options = parser.parse_args()
    env = dict(os.environ)
    log = Path(tempfile.mkdtemp(prefix="latency-profile-")) / "stamps"
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        SQLTASKS_POLL_INTERVAL="1",
        PROFILE_LOG=str(log),
        PROBES=str(options.probes),
    )
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    manage = [sys.executable, "-m", "django"]
    subprocess.run([*manage, "migrate", "-v0"], env=env, cwd=ROOT, check=True)
    subprocess.run(
        [
            *manage,
            "shell",
            "-c",
            "from django_sqltasks.models import TaskRecord; TaskRecord.objects.all().delete()",
        ],
        env=env,
        cwd=ROOT,
        check=True,
    )
    worker = subprocess.Popen([sys.executable, "-c", WORKER], env=env, cwd=ROOT)
    try:
        time.sleep(3)
        subprocess.run([sys.executable, "-c", ENQUEUER], env=env, cwd=ROOT, check=True)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    steps = segments(log)
    print(f"{len(steps.get('total', []))} probes; median milliseconds of each step:")
    print("| step (ends when) | median ms | p90 ms |\n|---|---|---|")
    for step in ("enqueue() call", *STEPS, "total"):
        values = sorted(steps.get(step, [0.0]))
        p90 = values[int(len(values) * 0.9)]
        print(f"| {step} | {statistics.median(values):.3f} | {p90:.3f} |")
    print(server_costs(env))


if __name__ == "__main__":
    main()
