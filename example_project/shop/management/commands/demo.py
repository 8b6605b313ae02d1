"""``manage.py demo``: migrate, enqueue a few tasks, run a burst worker, and show what happened."""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from django.utils import timezone

from django_sqltasks import chain, error_summary, signature
from django_sqltasks.worker import Worker
from shop.tasks import (
    charge_card,
    email_receipt,
    fetch_exchange_rate,
    rebuild_search_index,
    render_invoice,
    send_order_confirmation,
)

try:
    from django.tasks import TaskResult, TaskResultStatus, default_task_backend
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import TaskResult, TaskResultStatus, default_task_backend

MAX_ROUNDS = 5  # burst runs before giving up on tasks that never became due
QUIET_LOGGERS = ("django_sqltasks", "django.tasks", "django_tasks")


@dataclass
class Enqueued:
    label: str
    result: TaskResult
    expected: str


class Command(BaseCommand):
    help = "Show django-sqltasks end to end: migrate, enqueue tasks, run a worker, print results."

    def handle(self, *args: Any, **options: Any) -> None:
        verbosity = options["verbosity"]
        if verbosity < 2:
            # The failing task is logged with its traceback; the table below says it more briefly.
            for name in QUIET_LOGGERS:
                logging.getLogger(name).setLevel(logging.CRITICAL)

        database = default_task_backend.database
        connection = connections[database]
        self.stdout.write(f"Database: {connection.vendor} ({connection.settings_dict['NAME']})")
        self.stdout.write("Running migrate...")
        call_command("migrate", interactive=False, verbosity=0)

        enqueued = self._enqueue()
        self.stdout.write(f"Enqueued {len(enqueued)} tasks. Running a worker in burst mode...")
        started = time.monotonic()
        self._run_worker(enqueued)
        elapsed = time.monotonic() - started

        for item in enqueued:
            item.result.refresh()
        self.stdout.write(f"Worker finished in {elapsed:.1f}s.\n")
        self._print_table(enqueued)
        self._print_next_steps()

        wrong = [i for i in enqueued if i.result.status != i.expected]
        if wrong:
            raise CommandError(
                "Unexpected outcome: "
                + ", ".join(f"{i.label} is {i.result.status}, expected {i.expected}" for i in wrong)
            )

    def _enqueue(self) -> list[Enqueued]:
        ok, failed = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED
        in_a_second = timezone.now() + timedelta(seconds=1)
        # A chain: the receipt step runs once the charge succeeded, with the charge's result.
        paid = chain(
            signature(charge_card, order_id=4, amount_cents=40_00),
            signature(email_receipt, email="ada@example.com"),
        ).enqueue()
        return [
            Enqueued(
                "send_order_confirmation (emails queue)",
                send_order_confirmation.enqueue(order_id=1, email="ada@example.com"),
                ok,
            ),
            Enqueued("fetch_exchange_rate (async)", fetch_exchange_rate.enqueue("EUR"), ok),
            Enqueued(
                "charge_card (raises)", charge_card.enqueue(order_id=2, amount_cents=250_00), failed
            ),
            Enqueued("render_invoice (sleeps 1.5s)", render_invoice.enqueue(order_id=1), ok),
            Enqueued(
                "send_order_confirmation (run_after +1s)",
                send_order_confirmation.using(run_after=in_a_second).enqueue(
                    order_id=3, email="grace@example.com"
                ),
                ok,
            ),
            Enqueued("chain: charge_card, then email_receipt", paid.members[-1], ok),
            Enqueued(
                "rebuild_search_index (priority 10, context)",
                rebuild_search_index.using(priority=10).enqueue(reason="demo"),
                ok,
            ),
        ]

    def _run_worker(self, enqueued: list[Enqueued]) -> None:
        """Run burst workers until none of the demo's tasks is waiting.

        A burst worker exits as soon as nothing is due and nothing runs, so a task deferred
        past that moment needs another run once it is due.
        """
        for _ in range(MAX_ROUNDS):
            Worker(queue_names=["*"], burst=True, concurrency=8).run()
            waiting = []
            for item in enqueued:
                item.result.refresh()
                if item.result.status == TaskResultStatus.READY:
                    waiting.append(item)
            if not waiting:
                return
            due = max(i.result.task.run_after or timezone.now() for i in waiting)
            pause = max(0.0, (due - timezone.now()).total_seconds())
            self.stdout.write(
                f"{len(waiting)} task(s) not due yet; running the worker again in {pause:.1f}s..."
            )
            time.sleep(pause)

    def _print_table(self, enqueued: list[Enqueued]) -> None:
        rows = [("TASK", "STATUS", "ATTEMPTS", "RESULT")]
        for item in enqueued:
            result = item.result
            if result.status == TaskResultStatus.SUCCESSFUL:
                outcome = repr(result.return_value)
            elif result.errors:
                outcome = error_summary(result.errors[-1])
            else:
                outcome = "-"
            rows.append((item.label, str(result.status), str(result.attempts), outcome))
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        for index, row in enumerate(rows):
            cells = zip(row[:3], widths, strict=True)
            line = "  ".join(cell.ljust(width) for cell, width in cells) + "  " + row[3]
            if index == 0:
                self.stdout.write(line)
                continue
            status = row[1]
            style = {
                TaskResultStatus.SUCCESSFUL: self.style.SUCCESS,
                TaskResultStatus.FAILED: self.style.ERROR,
            }.get(status, self.style.WARNING)
            self.stdout.write(style(line))
        self.stdout.write("")

    def _print_next_steps(self) -> None:
        # The interpreter that runs the demo (.venv/bin/python after make example): a bare
        # "python" may be another one, without Django.
        python = sys.executable
        if python.startswith(os.getcwd() + os.sep):
            python = os.path.relpath(python)
        manage = f"{python} example_project/manage.py"
        self.stdout.write(
            "Every task above is a row in the database. Next:\n"
            f"  - browse them in the admin: {manage} createsuperuser && {manage} runserver,\n"
            "    then open http://127.0.0.1:8000/admin/\n"
            f"  - run a worker that keeps going: {manage} tasks_worker --queue '*'\n"
            "  - enqueue from the web (with runserver and a worker running):\n"
            "    curl -X POST http://127.0.0.1:8000/rates/EUR/"
        )
