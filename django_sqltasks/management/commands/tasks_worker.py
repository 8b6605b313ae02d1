"""``manage.py tasks_worker``: parse the options, then hand off to ``Worker``."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_sqltasks.compat import DEFAULT_TASK_BACKEND_ALIAS, InvalidTaskBackend
from django_sqltasks.management.arguments import (
    non_negative_int,
    positive_int,
    positive_seconds,
)
from django_sqltasks.worker import MAX_WORKER_ID_LENGTH, Worker

DEFAULT_CONCURRENCY = 10


def port(value: str) -> int:
    number = positive_int(value)
    if number > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port, 1 to 65535, not {number}")
    return number


def worker_id(value: str) -> str:
    if not 0 < len(value) <= MAX_WORKER_ID_LENGTH:
        raise argparse.ArgumentTypeError(
            f"must be 1 to {MAX_WORKER_ID_LENGTH} characters long, not {len(value)}"
        )
    return value


class Command(BaseCommand):
    help = "Run tasks enqueued through a django_sqltasks backend."
    # Only the checks a worker needs run, in handle(): its backend's and its database's.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            dest="queues",
            action="append",
            metavar="NAME",
            help="Queue to run tasks from; repeat for several, '*' for all (default: the "
            "backend's QUEUES, or 'default').",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=DEFAULT_CONCURRENCY,
            help=f"Tasks run at once in this process (default: {DEFAULT_CONCURRENCY}).",
        )
        parser.add_argument(
            "--prefetch",
            type=non_negative_int,
            help="Tasks claimed beyond the free slots, started as soon as a slot frees up "
            "(default: a quarter of --concurrency, rounded down; 0 claims only for free slots).",
        )
        parser.add_argument(
            "--burst", action="store_true", help="Exit once no runnable task is left."
        )
        parser.add_argument(
            "--max-tasks", type=positive_int, help="Exit after running this many tasks."
        )
        parser.add_argument(
            "--backend",
            default=DEFAULT_TASK_BACKEND_ALIAS,
            help="The TASKS alias whose tasks to run (default: 'default').",
        )
        parser.add_argument(
            "--worker-id",
            type=worker_id,
            help="A unique id for this worker (default: hostname and a random suffix).",
        )
        parser.add_argument(
            "--poll-interval",
            type=positive_seconds,
            help="Seconds between claims when idle (default: the POLL_INTERVAL option, 1s).",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=positive_seconds,
            help="On stop, seconds to wait for running tasks before requeueing them "
            "(default: wait for them).",
        )
        parser.add_argument(
            "--metrics-port",
            type=port,
            help="Serve Prometheus metrics on this port at /metrics (needs prometheus-client, "
            "the 'metrics' extra; default: off).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._configure_logging(options["verbosity"])
        try:
            from django_sqltasks.compat import task_backends

            backend = task_backends[options["backend"]]
        except InvalidTaskBackend as e:
            raise CommandError(f"--backend: {e}") from e
        self._check_backend(backend)
        queues = options["queues"] or sorted(backend.queues) or ["default"]
        try:
            worker = Worker(
                backend=options["backend"],
                queue_names=queues,
                concurrency=options["concurrency"],
                burst=options["burst"],
                max_tasks=options["max_tasks"],
                worker_id=options["worker_id"],
                poll_interval=options["poll_interval"],
                shutdown_timeout=options["shutdown_timeout"],
                prefetch=options["prefetch"],
            )
        except ValueError as e:
            raise CommandError(str(e)) from e
        try:
            worker.check_database()
        except RuntimeError as e:
            raise CommandError(str(e)) from e
        if options["metrics_port"] is not None:
            from django_sqltasks import metrics

            try:
                metrics.serve(options["metrics_port"], using=worker.database)
            except (RuntimeError, OSError) as e:
                raise CommandError(f"--metrics-port: {e}") from e
        try:
            worker.run()
        except RuntimeError as e:
            raise CommandError(str(e)) from e
        if worker.abandoned:
            # Threads of requeued sync tasks cannot be interrupted; leave without joining them.
            logging.shutdown()
            os._exit(0)

    def _check_backend(self, backend: Any) -> None:
        """Run the backend's own checks (not the whole ``check`` suite: a worker starts faster
        and holds less memory without the URL, template and admin checks)."""
        messages = backend.check()
        for message in messages:
            if not message.is_serious():
                self.stderr.write(f"{message.id}: {message.msg}")
        errors = [message for message in messages if message.is_serious()]
        if errors:
            raise CommandError(
                "\n".join(
                    f"{e.id}: {e.msg}" + (f" HINT: {e.hint}" if e.hint else "") for e in errors
                )
            )

    def _configure_logging(self, verbosity: int) -> None:
        logger = logging.getLogger("django_sqltasks")
        level = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}.get(
            verbosity, logging.DEBUG
        )
        logger.setLevel(level)
        if not logger.hasHandlers():
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            logger.addHandler(handler)
