"""``manage.py tasks_worker``: parse the options, then hand off to ``Worker``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...compat import DEFAULT_TASK_BACKEND_ALIAS, InvalidTaskBackend, task_backends
from ...core.bounds import MAX_INTERVAL
from ...ops import metrics
from ...worker import Worker
from ...worker.checks import check_database, default_worker_id
from ...worker.lease import EXIT_ID_IN_USE, WorkerIdInUse
from ...worker.processes.health_file import toucher
from ...worker.processes.pipe import SupervisorLink, die_with_parent
from ...worker.processes.supervisor import Supervisor
from .. import logs, startup
from ..arguments import (
    MAX_NAME_LENGTH,
    backend_alias,
    level_number,
    log_level,
    megabytes,
    non_negative_seconds,
    positive_int,
    positive_seconds,
    queue_names,
    refuse_unknown_queues,
    seconds_at_least,
    text,
    whole_number,
)
from ..help import HelpFormatter, package_version

DEFAULT_CONCURRENCY = 10
# Ceilings that catch a typo (an extra zero or three) before it becomes thousands of threads
# or a claim that locks a whole table; far above what one process can use.
MAX_CONCURRENCY = 1000
MAX_PREFETCH = 10_000
MIN_POLL_INTERVAL = 0.01  # seconds: below this an idle worker commits a claim per few ms
DEFAULT_METRICS_HOST = "127.0.0.1"  # metrics name queues and tasks: not for other machines
MAX_PROCESSES = 256  # a typo's ceiling: far above the cores of one machine
# A supervisor's children are named after it: its id, a dash, and a number.
MAX_SUPERVISOR_ID_LENGTH = MAX_NAME_LENGTH - 8

EXAMPLES = """\
examples:
  manage.py tasks_worker                            the backend's QUEUES (or 'default'), 10 at once
  manage.py tasks_worker -Q emails,reports -c 50    two queues, up to 50 tasks at once
  manage.py tasks_worker -Q '*' --burst             every queue until nothing is due, then exit
  manage.py tasks_worker -Q '*' -X bulk             every queue of QUEUES but 'bulk'
  manage.py tasks_worker -l info                    also log each task's start and end
  manage.py tasks_worker --wait-for-database 60     start before the database is up (containers)

Stop with SIGTERM or Ctrl-C: unstarted tasks go back to the queue and running ones finish;
a second signal puts the running ones back too and exits at once.
"""


def port(value: str) -> int:
    number = positive_int(value)
    if number > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port, 1 to 65535, not {number}")
    return number


def worker_id(value: str) -> str:
    return text(value, "a worker id", most=MAX_NAME_LENGTH)


def host(value: str) -> str:
    return text(value, most=255)


def health_file(value: str) -> str:
    return text(value, "a path", most=4096)


def supervisor_link(value: str) -> tuple[int, int]:
    """The hidden ``--supervisor FD,PID`` a supervisor gives its children."""
    try:
        fd, pid = (int(part) for part in value.split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"must be FD,PID, not {value!a}") from e
    return fd, pid


class Command(BaseCommand):
    help = "Run tasks enqueued through a django_sqltasks backend."
    # Only the checks a worker needs run, in handle(): its backend's and its database's.
    requires_system_checks: list[str] = []

    def get_version(self) -> str:
        return package_version()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.formatter_class = HelpFormatter
        parser.epilog = EXAMPLES
        parser.add_argument(
            "-Q",
            "--queue",
            "--queues",
            dest="queues",
            action="append",
            type=queue_names,
            metavar="NAME[,NAME...]",
            help="Queues to run tasks from: comma-separated or repeated, '*' for all (default: "
            "the backend's QUEUES, or 'default'). With QUEUES set, other names are refused.",
        )
        parser.add_argument(
            "-X",
            "--exclude-queues",
            dest="exclude_queues",
            action="append",
            type=queue_names,
            metavar="NAME[,NAME...]",
            help="Run every queue of the backend's QUEUES but these (comma-separated or "
            "repeated), as Celery's -X; with -Q '*' or no -Q only.",
        )
        parser.add_argument(
            "-c",
            "--concurrency",
            type=whole_number(1, MAX_CONCURRENCY),
            default=DEFAULT_CONCURRENCY,
            metavar="N",
            help=f"Tasks run at once in this process, 1 to {MAX_CONCURRENCY} "
            f"(default: {DEFAULT_CONCURRENCY}).",
        )
        parser.add_argument(
            "--prefetch",
            type=whole_number(0, MAX_PREFETCH),
            metavar="N",
            help="Tasks claimed beyond the free slots, started as soon as a slot frees up, "
            f"0 to {MAX_PREFETCH} (default: a quarter of --concurrency; 0 for long tasks "
            "shared by several workers).",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit once no task is due and none is running. A task waiting out a retry's "
            "backoff or deferred with run_after is not due: it stays READY for the next worker.",
        )
        parser.add_argument(
            "--max-tasks",
            type=positive_int,
            metavar="N",
            help="Exit after claiming this many tasks and finishing them (default: no limit).",
        )
        parser.add_argument(
            "--backend",
            type=backend_alias,
            default=DEFAULT_TASK_BACKEND_ALIAS,
            metavar="ALIAS",
            help="The TASKS alias whose tasks to run (default: 'default').",
        )
        parser.add_argument(
            "--worker-id",
            type=worker_id,
            metavar="ID",
            help=f"A unique id for this worker, up to {MAX_NAME_LENGTH} characters "
            "(default: hostname and a random suffix).",
        )
        parser.add_argument(
            "--poll-interval",
            type=seconds_at_least(MIN_POLL_INTERVAL, MAX_INTERVAL),
            metavar="S",
            help=f"Seconds between claims when idle, {MIN_POLL_INTERVAL:g} to {MAX_INTERVAL:g} "
            "(default: the POLL_INTERVAL option, 1).",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=positive_seconds,
            metavar="S",
            help="On stop, seconds to wait for running tasks before requeueing them "
            "(default: wait for them).",
        )
        parser.add_argument(
            "--wait-for-database",
            type=non_negative_seconds,
            default=0.0,
            metavar="S",
            help="If the database cannot be reached at start, keep trying for this many "
            "seconds, with backoff (default: 0, fail at once).",
        )
        parser.add_argument(
            "-l",
            "--loglevel",
            type=log_level,
            metavar="LEVEL",
            help="DEBUG, INFO, WARNING, ERROR or CRITICAL, for the worker's log and Django's "
            "task log (default: from -v: 0 WARNING, 1 INFO, 2 DEBUG).",
        )
        parser.add_argument(
            "--metrics-port",
            type=port,
            metavar="PORT",
            help="Serve Prometheus metrics on this port at /metrics (needs prometheus-client, "
            "the 'metrics' extra; default: off).",
        )
        parser.add_argument(
            "--metrics-host",
            type=host,
            default=DEFAULT_METRICS_HOST,
            metavar="HOST",
            help=f"The address --metrics-port listens on (default: {DEFAULT_METRICS_HOST}, this "
            "machine only; 0.0.0.0 for every interface).",
        )
        parser.add_argument(
            "--health-file",
            type=health_file,
            metavar="PATH",
            help="Touch this file at each heartbeat while the worker makes progress (with "
            "--processes: while every worker process does), for a liveness probe that checks "
            "its age (default: none).",
        )
        parser.add_argument(
            "-p",
            "--processes",
            type=whole_number(1, MAX_PROCESSES),
            metavar="N",
            help="Run N worker processes under a supervisor that restarts them, renews their "
            "leases, and stops sync tasks at their timeout by replacing their process "
            f"(1 to {MAX_PROCESSES}; default: one process, no supervisor).",
        )
        parser.add_argument(
            "--max-tasks-per-child",
            type=positive_int,
            metavar="N",
            help="With --processes: replace a worker process after it has claimed N tasks "
            "(the replacement starts first; default: no limit).",
        )
        parser.add_argument(
            "--max-memory-per-child",
            type=megabytes,
            metavar="SIZE",
            help="With --processes: replace a worker process whose resident memory exceeds "
            "this size, checked every second: 512 or 512MB (MiB; Celery's option counts KiB), "
            "200000KiB, 2GiB (Linux; default: no limit).",
        )
        parser.add_argument("--supervisor", type=supervisor_link, help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        loglevel = options["loglevel"]
        logs.configure(options["verbosity"], level_number(loglevel) if loglevel else None)
        try:
            backend = task_backends[options["backend"]]
        except InvalidTaskBackend as e:
            raise CommandError(f"--backend: {e}") from e
        self._check_backend(backend)
        queues = self._queues(backend, options["queues"], options["exclude_queues"])
        if options["processes"] is not None:
            self._supervise(backend, queues, options)
            return
        self._refuse_without_processes(options)
        link = None
        if options["supervisor"] is not None:
            fd, parent = options["supervisor"]
            die_with_parent(parent)
            link = SupervisorLink(fd)
        health = toucher(options["health_file"])

        def on_beat(renewed: bool) -> None:
            if link is not None:
                link.beat(renewed, worker.claimed)
            if health is not None:
                health(renewed)

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
                on_beat=on_beat,
                supervisor=link,
            )
        except ValueError as e:
            raise CommandError(str(e)) from e
        self._connect(worker.check_database, worker.database, options)
        if options["metrics_port"] is not None:
            try:
                metrics.serve(
                    options["metrics_port"], using=worker.database, addr=options["metrics_host"]
                )
            except (RuntimeError, OSError) as e:
                raise CommandError(f"--metrics-port: {e}") from e
        try:
            worker.run()
        except WorkerIdInUse as e:
            raise CommandError(str(e), returncode=EXIT_ID_IN_USE) from e
        except RuntimeError as e:
            raise CommandError(str(e)) from e
        if worker.abandoned:
            # Threads of requeued sync tasks cannot be interrupted; leave without joining them.
            logging.shutdown()
            os._exit(0)

    def _supervise(self, backend: Any, queues: list[str], options: dict[str, Any]) -> None:
        """Check the options and the database, then run the worker processes' supervisor."""
        for option in ("max_tasks", "metrics_port"):
            if options[option] is not None:
                flag = "--" + option.replace("_", "-")
                raise CommandError(
                    f"{flag}: not with --processes"
                    + (" (use --max-tasks-per-child)" if option == "max_tasks" else "")
                )
        if options["max_memory_per_child"] is not None and sys.platform != "linux":
            raise CommandError("--max-memory-per-child: needs Linux (it reads /proc)")
        base = options["worker_id"] or default_worker_id()
        if len(base) > MAX_SUPERVISOR_ID_LENGTH:
            raise CommandError(
                f"--worker-id: must be at most {MAX_SUPERVISOR_ID_LENGTH} characters with "
                "--processes (each process adds a dash and a number), not "
                f"{len(base)}"
            )
        self._connect(lambda: check_database(backend.database), backend.database, options)
        supervisor = Supervisor(
            command=self._child_arguments(queues, options),
            processes=options["processes"],
            worker_id=base,
            backend=options["backend"],
            burst=options["burst"],
            shutdown_timeout=options["shutdown_timeout"],
            max_tasks_per_child=options["max_tasks_per_child"],
            max_memory_per_child=options["max_memory_per_child"],
            health_file=options["health_file"],
        )
        try:
            status = supervisor.run()
        except WorkerIdInUse as e:
            raise CommandError(str(e), returncode=EXIT_ID_IN_USE) from e
        if status:
            sys.exit(status)

    def _connect(self, check: Any, database: str, options: dict[str, Any]) -> None:
        try:
            startup.connect(check, database, options["wait_for_database"])
        except startup.DatabaseUnreachable as e:
            waited = options["wait_for_database"]
            hint = "" if waited else "; pass --wait-for-database S to wait for it"
            raise CommandError(f"{e}{hint}") from e
        except RuntimeError as e:
            raise CommandError(str(e)) from e

    def _child_arguments(self, queues: list[str], options: dict[str, Any]) -> list[str]:
        """The options of each worker process a supervisor starts."""
        arguments = ["--backend", options["backend"], "--queue", ",".join(queues)]
        arguments += ["--concurrency", str(options["concurrency"])]
        arguments += ["-v", str(options["verbosity"])]
        arguments += ["--wait-for-database", repr(options["wait_for_database"])]
        for option, flag in (
            ("prefetch", "--prefetch"),
            ("poll_interval", "--poll-interval"),
            ("shutdown_timeout", "--shutdown-timeout"),
            ("loglevel", "--loglevel"),
            ("max_tasks_per_child", "--max-tasks"),
        ):
            if options[option] is not None:
                arguments += [flag, str(options[option])]
        if options["burst"]:
            arguments.append("--burst")
        return arguments

    def _refuse_without_processes(self, options: dict[str, Any]) -> None:
        for option in ("max_tasks_per_child", "max_memory_per_child"):
            if options[option] is not None:
                raise CommandError(f"--{option.replace('_', '-')}: only with --processes")

    def _queues(
        self, backend: Any, given: list[list[str]] | None, excluded: list[list[str]] | None
    ) -> list[str]:
        """The queues to run: those given (flattened, in order, once each), else the default;
        with ``excluded``, every queue of QUEUES but those."""
        names = list(dict.fromkeys(name for names in given or [] for name in names))
        refuse_unknown_queues(backend, names)
        if excluded:
            return self._all_but(backend, names, [name for names in excluded for name in names])
        if not names:
            return sorted(backend.queues) or ["default"]
        return names

    def _all_but(self, backend: Any, given: list[str], excluded: list[str]) -> list[str]:
        if given and given != ["*"]:
            raise CommandError(
                "--exclude-queues: use it with -Q '*' or without -Q, not with a list of queues "
                "(leave the excluded ones out of the list instead)."
            )
        if not backend.queues:
            raise CommandError(
                f"--exclude-queues: backend {backend.alias!r} has no QUEUES, so any queue name "
                "is valid and the worker cannot know them all: list QUEUES in its settings, or "
                "name the queues to run with -Q."
            )
        refuse_unknown_queues(backend, excluded)
        left = sorted(set(backend.queues) - set(excluded))
        if not left:
            raise CommandError("--exclude-queues: it excludes every queue of QUEUES.")
        return left

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
