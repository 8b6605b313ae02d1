"""``manage.py tasks_worker``: parse the options, then hand off to ``Worker``."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...compat import InvalidTaskBackend, task_backends
from ...worker import Worker
from ...worker.checks import check_database, default_worker_id
from ...worker.lease import EXIT_ID_IN_USE, WorkerIdInUse
from ...worker.processes.health_file import toucher
from .. import logs, startup
from ..arguments import (
    backend_error,
    level_number,
    refuse_unknown_queues,
)
from ..help import package_version
from ..pipes import QuietWhenPipeCloses
from ..worker_options import MAX_SUPERVISOR_ID_LENGTH, add_worker_arguments


class Command(QuietWhenPipeCloses):
    help = "Run tasks enqueued through a django_sqltasks backend."
    # Only the checks a worker needs run, in handle(): its backend's and its database's.
    requires_system_checks: list[str] = []

    def get_version(self) -> str:
        return package_version()

    def add_arguments(self, parser: CommandParser) -> None:
        add_worker_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        loglevel = options["loglevel"]
        logs.configure(options["verbosity"], level_number(loglevel) if loglevel else None)
        try:
            backend = task_backends[options["backend"]]
        except InvalidTaskBackend as e:
            raise backend_error(options["backend"], e) from e
        self._check_backend(backend)
        queues = self._queues(backend, options["queues"], options["exclude_queues"])
        if options["processes"] is not None:
            self._supervise(backend, queues, options)
            return
        self._refuse_without_processes(options)
        link = None
        relay_fd = None
        if options["supervisor"] is not None:
            # Start-up: a worker without a supervisor does not load the pipe's module.
            from ...worker.processes.pipe import SupervisorLink, die_with_parent

            fd, parent, relay_fd = options["supervisor"]
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
                relay_fd=relay_fd,
            )
        except ValueError as e:
            raise CommandError(str(e)) from e
        self._connect(worker.check_database, worker.database, options)
        if options["metrics_port"] is not None:
            # Start-up: a worker without --metrics-port does not load the exporter's module.
            from ...ops import metrics

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
        # Start-up: a single worker process does not load the supervisor's modules.
        from ...worker.processes.supervisor import Supervisor

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
            queue_names=queues,
            concurrency=options["concurrency"],
            poll_interval=options["poll_interval"],
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
        refuse_unknown_queues(backend, excluded, "--exclude-queues")
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
