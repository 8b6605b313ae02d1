"""A burst worker's CPU per task and the most PostgreSQL connections it held, over N tasks of
one kind: ``noop`` (no database), ``orm`` (one query), ``step`` (a durable task of one step),
``park`` (a durable task that writes one step and parks at a wait for its event: the burst
worker ends once every task is parked), with Django's settings as they are or with Django's
connection pool (``--pool``).

Out of CI; see docs/worker.md ("Database connections"). Run on a scratch database, which it
migrates and whose task rows it deletes:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/scratch \\
        .venv/bin/python scripts/pool_figures.py --kind step --tasks 2000
    ... --pool '{"min_size": 2, "max_size": 8}'

The connections are counted in ``pg_stat_activity`` by the worker's ``application_name``,
every 5 ms while it runs, from a connection of the script's own (not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APPLICATION_NAME = "sqltasks-pool-figures"
SAMPLE_EVERY = 0.005  # seconds between two counts of the worker's connections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("noop", "orm", "step", "park"), default="step")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pool", help="DATABASES['default']['OPTIONS']['pool'], as JSON")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    os.chdir(ROOT)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    os.environ["PGAPPNAME"] = APPLICATION_NAME
    if args.pool:
        os.environ["SQLTASKS_TEST_POOL"] = args.pool
    import django

    django.setup()
    # After setup: these import the models.
    from django.core.management import call_command
    from django.db import connection, connections

    from django_sqltasks.compat import task_backends
    from django_sqltasks.models import EventRecord, StepRecord, TaskRecord
    from django_sqltasks.worker import Worker
    from tests import tasks, tasks_durable

    assert connection.vendor == "postgresql", "the connection counts are PostgreSQL's"
    call_command("migrate", verbosity=0)
    task = {
        "noop": tasks.noop,
        "orm": tasks.count_rows,
        "step": tasks_durable.one_step,
        "park": tasks_durable.waiter,
    }[args.kind]
    log = os.path.join(tempfile.mkdtemp(prefix="pool-figures-"), "effects")
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = (
        [((log, "order.paid", str(i), 3600), {}) for i in range(args.tasks)]
        if args.kind == "park"
        else [((), {})] * args.tasks
    )
    for round_ in range(args.rounds):
        EventRecord.objects.all().delete()
        StepRecord.objects.all().delete()
        TaskRecord.objects.all().delete()
        tables = ", ".join(m._meta.db_table for m in (TaskRecord, StepRecord, EventRecord))
        with connection.cursor() as cursor:  # the shared server runs with autovacuum off
            cursor.execute(f"VACUUM {tables}")
        task_backends["default"].enqueue_many(task, calls)  # type: ignore[attr-defined]
        connections.close_all()
        counter = _Counter()
        counter.start()
        before = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        worker = Worker(concurrency=args.concurrency, queue_names=["*"], burst=True)
        worker.run()
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
        counter.stop()
        # The worker's CPU: the process's, less what the counting thread spent (it polls
        # every 5 ms for as long as the run lasts, so a slower kind would pay more of it).
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime - counter.cpu
        done = TaskRecord.objects.filter(status="SUCCESSFUL").count()
        parked = StepRecord.objects.filter(state="waiting").count()
        print(
            json.dumps(
                {
                    "kind": args.kind,
                    "pool": json.loads(args.pool) if args.pool else None,
                    "round": round_ + 1,
                    "tasks": args.tasks,
                    "successful": done,
                    "parked": parked,
                    "cpu_ms_per_task": round(cpu / args.tasks * 1000, 3),
                    "tasks_per_s": round(args.tasks / wall),
                    "most_connections": counter.most,
                    "connections_opened": counter.opened,
                }
            ),
            flush=True,
        )


class _Counter(threading.Thread):
    """Counts the worker's sessions in pg_stat_activity until stopped: the most at once, and
    how many distinct ones there were."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.most = 0
        self.cpu = 0.0  # seconds of CPU this thread spent, set when it stops
        self._seen: set[Any] = set()
        self._stop = threading.Event()

    @property
    def opened(self) -> int:
        return len(self._seen)

    def run(self) -> None:
        import psycopg
        from django.db import connection

        params = connection.get_connection_params()
        for key in ("cursor_factory", "context", "server_side_binding"):
            params.pop(key, None)
        params["application_name"] = "sqltasks-pool-counter"
        with psycopg.connect(**params, autocommit=True) as own:
            while not self._stop.is_set():
                rows = own.execute(
                    "SELECT pid, backend_start FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name = %s",
                    [APPLICATION_NAME],
                ).fetchall()
                self.most = max(self.most, len(rows))
                self._seen.update(rows)
                self._stop.wait(SAMPLE_EVERY)
        self.cpu = time.thread_time()

    def stop(self) -> None:
        self._stop.set()
        self.join()


if __name__ == "__main__":
    main()
