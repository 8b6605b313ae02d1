"""``manage.py tasks_health``: parse the options, then hand off to ``probe.probe``."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from ...ops.probe import DEFAULT_MAX_AGE, Exit, Report, probe
from ...sql.installation import is_missing_table, not_migrated
from ..arguments import add_scope_arguments, chosen_scope, positive_seconds
from ..help import HelpFormatter, package_version, terminal_safe

EPILOG = f"""exit status:
  0  healthy
  1  an error in the command's use (an unknown backend, a database not migrated)
  2  bad arguments
  {Exit.DATABASE_UNREACHABLE:d}  a database holding tasks cannot be reached
  {Exit.NO_LIVE_WORKER:d}  no live worker (none sent a heartbeat within LEASE_TIMEOUT)
  {Exit.QUEUE_UNSERVED:d}  a queue is served by no live worker
  {Exit.BACKLOG_TOO_OLD:d}  a queue's oldest due task has waited longer than --max-age
When several hold, the lowest is returned.

examples:
  manage.py tasks_health                         every backend and queue
  manage.py tasks_health --max-age 60 -Q emails  a container probe for one queue
  manage.py tasks_health --json                  for a script or a monitoring agent"""


class Command(BaseCommand):
    help = (
        "Check that a worker is alive, every queue is served and no due task has waited too "
        "long; exit with a status a container probe or cron can act on."
    )
    # A probe must be quick and must not fail on a warning of another app: no system checks.
    requires_system_checks: list[str] = []

    def get_version(self) -> str:
        return package_version()

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        return super().create_parser(
            prog_name, subcommand, formatter_class=HelpFormatter, epilog=EPILOG, **kwargs
        )

    def add_arguments(self, parser: CommandParser) -> None:
        add_scope_arguments(
            parser,
            "Check these queues only (default: the backend's QUEUES and every queue holding a "
            "due task).",
        )
        parser.add_argument(
            "--max-age",
            metavar="SECONDS",
            type=positive_seconds,
            default=DEFAULT_MAX_AGE,
            help=f"How long a due task may wait to be claimed (default {DEFAULT_MAX_AGE:g}).",
        )
        parser.add_argument(
            "--json", action="store_true", help="Print the report as one JSON object."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        chosen, queues = chosen_scope(options)
        report = Report([], [])
        for backend in chosen:
            try:
                found = probe([backend], queues, options["max_age"])
            except DatabaseError as e:
                if is_missing_table(e):
                    raise CommandError(not_migrated(backend.database)) from e
                raise
            report.backends.extend(found.backends)
            report.problems.extend(found.problems)
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict()))
        else:
            self._text(report)
        if report.exit != Exit.HEALTHY:
            raise CommandError(
                f"unhealthy ({report.exit.name.lower()})", returncode=int(report.exit)
            )

    def _text(self, report: Report) -> None:
        for backend in report.backends:
            workers = len(backend.live_workers)
            self.stdout.write(
                f"{terminal_safe(backend.backend)}: "
                + (f"{workers} live worker(s)" if backend.reachable else "database unreachable")
            )
            for queue in backend.queues:
                age = queue.oldest_due_seconds
                self.stdout.write(
                    f"  {terminal_safe(queue.queue)}: "
                    + ("served" if queue.served else "NOT served")
                    + (", paused" if queue.paused else "")
                    + (", nothing due" if age is None else f", oldest due {age:.0f}s")
                )
        for problem in report.problems:
            self.stdout.write(f"{problem.exit.name}: {terminal_safe(problem.message)}")
        if not report.problems:
            self.stdout.write("OK")
