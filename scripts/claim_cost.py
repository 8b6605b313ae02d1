"""SQL statements and worker CPU per task of a burst worker over N no-op tasks, and the
statements and CPU a second of an idle worker, for the django_sqltasks of one directory.

Out of CI; see docs/tasks.md ("What it costs a project with no limits"). To compare two
commits, extract each (``git archive --format=tar REF django_sqltasks tests | tar -x -C DIR``)
and run this once a directory, alternating, each on its own scratch database (a database
migrated by one commit may lack the tables of the other):

    SQLTASKS_SQLITE_PATH=/tmp/a.sqlite3 .venv/bin/python scripts/claim_cost.py DIR --tasks 5000

It counts every statement run through Django's cursors (on PostgreSQL the main claim runs on
the worker's event loop, through psycopg's own, and is not counted), and the process's CPU
time. It deletes every task row of the database it is pointed at.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="a directory holding django_sqltasks/ and tests/")
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of an idle worker")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    sys.path.insert(0, root)
    os.chdir(root)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    # After setup: these import the models.
    from django.core.management import call_command
    from django.db import connection
    from django.db.backends import utils

    import django_sqltasks
    from django_sqltasks.compat import task_backends
    from django_sqltasks.models import TaskRecord
    from django_sqltasks.worker import Worker
    from tests import tasks

    assert django_sqltasks.__file__.startswith(root), django_sqltasks.__file__
    call_command("migrate", verbosity=0)
    count = [0]
    lock = threading.Lock()
    execute, executemany = utils.CursorWrapper.execute, utils.CursorWrapper.executemany

    def counted(method: Any) -> Any:
        def run(self: Any, *a: Any, **k: Any) -> Any:
            with lock:
                count[0] += 1
            return method(self, *a, **k)

        return run

    def counting(on: bool) -> None:
        utils.CursorWrapper.execute = counted(execute) if on else execute  # type: ignore[method-assign]
        utils.CursorWrapper.executemany = counted(executemany) if on else executemany  # type: ignore[method-assign]
        count[0] = 0

    backend = task_backends["default"]
    for _ in range(args.rounds):
        TaskRecord.objects.all().delete()
        for _ in range(0, args.tasks, 500):
            backend.enqueue_many(tasks.noop, [((), {})] * 500)  # type: ignore[attr-defined]
        counting(True)
        cpu, wall = time.process_time(), time.monotonic()
        Worker(burst=True, queue_names=["*"], concurrency=50).run()
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        statements = count[0]
        counting(False)
        done = TaskRecord.objects.filter(status="SUCCESSFUL").count()
        print(
            json.dumps(
                {
                    "vendor": connection.vendor,
                    "tasks": done,
                    "statements_per_task": round(statements / done, 4),
                    "cpu_us_per_task": round(cpu / done * 1e6, 1),
                    "wall_s": round(wall, 3),
                }
            )
        )
    TaskRecord.objects.all().delete()
    counting(True)
    worker = Worker(queue_names=["*"], concurrency=50)
    runner = threading.Thread(target=worker.run)
    cpu = time.process_time()
    runner.start()
    time.sleep(args.idle)  # an idle worker, measured over a fixed span
    worker.stop()
    runner.join()
    cpu = time.process_time() - cpu
    statements = count[0]
    counting(False)
    print(
        json.dumps(
            {
                "vendor": connection.vendor,
                "idle_statements_per_s": round(statements / args.idle, 2),
                "idle_cpu_ms_per_s": round(cpu / args.idle * 1e3, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
