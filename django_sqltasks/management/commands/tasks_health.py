"""``manage.py tasks_health``: parse the options, then hand off to ``probe.probe``."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...ops.claims import DEFAULT_MAX_CLAIM_MEAN, DEFAULT_WARN_CLAIM_MEAN, describe
from ...ops.configuration import configuration_problems
from ...ops.probe import probe
from ...ops.probe_report import (
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_TRANSACTION_AGE,
    DEFAULT_TIMEOUT,
    Exit,
    Limits,
    Report,
)
from ..arguments import add_scope_arguments, chosen_scope, positive_seconds
from ..help import HelpFormatter, package_version, terminal_safe

EPILOG = f"""exit status:
  0  healthy
  {Exit.MISCONFIGURED:d}  nothing can run: no django_sqltasks backend in TASKS, a BACKEND that
     cannot be loaded, OPTIONS that break a rule, the tables not migrated
  2  bad arguments (an unknown --backend or --queue, a bad number)
  {Exit.DATABASE_UNREACHABLE:d}  a database holding tasks cannot be reached, takes no writes, or
     did not answer within --timeout
  {Exit.NO_LIVE_WORKER:d}  no live worker (none sent a heartbeat within LEASE_TIMEOUT)
  {Exit.QUEUE_UNSERVED:d}  a queue is served by no live worker
  {Exit.BACKLOG_TOO_OLD:d}  a queue's oldest due task has waited longer than --max-age
  {Exit.HORIZON_HELD:d}  a transaction has held back the task table's cleanup longer than
     --max-transaction-age (PostgreSQL, MariaDB/MySQL)
  {Exit.CLAIM_SLOW:d}  the live workers' claims took longer than --max-claim-mean on average over
     the last minute (a warning past --warn-claim-mean; unknown, never judged, where no
     worker published its claims)
When several hold, the lowest is returned.

examples:
  manage.py tasks_health                         every backend and queue
  manage.py tasks_health --max-age 60 -Q emails  a container probe for one queue
  manage.py tasks_health --json                  for a script or a monitoring agent"""


class Command(BaseCommand):
    help = (
        "Check that tasks can run (a backend configured, its tables migrated, its database "
        "reachable and writable), a worker is alive, every queue is served, no due task has "
        "waited too long, no transaction holds back the task table's cleanup and the claims "
        "are not slow; exit with a status a container probe or cron can act on."
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
            "--timeout",
            metavar="SECONDS",
            type=positive_seconds,
            default=DEFAULT_TIMEOUT,
            help="How long each database has to answer, lock waits included; past it the "
            f"probe exits {Exit.DATABASE_UNREACHABLE:d} (default {DEFAULT_TIMEOUT:g}).",
        )
        parser.add_argument(
            "--max-transaction-age",
            metavar="SECONDS",
            type=positive_seconds,
            default=DEFAULT_MAX_TRANSACTION_AGE,
            help="How long another transaction may hold back the cleanup of the task table "
            f"(default {DEFAULT_MAX_TRANSACTION_AGE:g}; it is warned of past "
            "SQLTASKS_OLD_TRANSACTION_SECONDS).",
        )
        parser.add_argument(
            "--warn-claim-mean",
            metavar="SECONDS",
            type=positive_seconds,
            default=DEFAULT_WARN_CLAIM_MEAN,
            help="The live workers' mean claim over the last minute past which a warning is "
            f"printed (default {DEFAULT_WARN_CLAIM_MEAN:g}).",
        )
        parser.add_argument(
            "--max-claim-mean",
            metavar="SECONDS",
            type=positive_seconds,
            default=DEFAULT_MAX_CLAIM_MEAN,
            help="The live workers' mean claim over the last minute past which the probe exits "
            f"{Exit.CLAIM_SLOW:d} (default {DEFAULT_MAX_CLAIM_MEAN:g}).",
        )
        parser.add_argument(
            "--json", action="store_true", help="Print the report as one JSON object."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            chosen, queues = chosen_scope(options)
        except CommandError as e:  # an unknown --backend or --queue: a usage error
            raise CommandError(str(e), returncode=2) from e
        if options["warn_claim_mean"] > options["max_claim_mean"]:
            raise CommandError(
                f"--warn-claim-mean ({options['warn_claim_mean']:g}) must be at most "
                f"--max-claim-mean ({options['max_claim_mean']:g}).",
                returncode=2,
            )
        limits = Limits(
            options["max_age"],
            options["timeout"],
            options["max_transaction_age"],
            options["warn_claim_mean"],
            options["max_claim_mean"],
        )
        problems = configuration_problems(chosen)
        # When nothing can run, no database is asked.
        report = Report([], problems) if problems else probe(chosen, queues, limits)
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
            if backend.reachable and backend.claims is not None and backend.claims.live:
                claims = backend.claims
                self.stdout.write(
                    f"  claims: {describe(claims.cost)} ({claims.reporting} of {claims.live} "
                    "live worker(s) reporting)"
                )
            if backend.upkeep:
                self.stdout.write(f"  task table: {terminal_safe(backend.upkeep)}")
            for note in backend.notes:
                self.stdout.write(f"  note: {terminal_safe(note)}")
        for warning in report.warnings:
            self.stdout.write(f"WARNING {warning.check_id}: {terminal_safe(warning.message)}")
        for problem in report.problems:
            self.stdout.write(f"{problem.exit.name}: {terminal_safe(problem.message)}")
        if not report.problems:
            self.stdout.write("OK")
