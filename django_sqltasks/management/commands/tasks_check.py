"""``manage.py tasks_check``: parse the options, then hand off to ``stranded.check_live_tasks``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from ...ops.stranded import DEFAULT_SAMPLE, Problem, check_live_tasks
from ...sql.installation import is_missing_table, not_migrated
from ..arguments import add_scope_arguments, chosen_scope, whole_number
from ..help import HelpFormatter, package_version, terminal_safe
from ..pipes import QuietWhenPipeCloses
from ..startup import OneLineWhenUnreachable

COLUMNS = ("backend", "task", "ready", "running", "example id", "problem")
MAX_SAMPLE = 100_000  # rows per task path

EPILOG = """examples:
  manage.py tasks_check                       every backend, every queue
  manage.py tasks_check --backend default -Q emails,reports
  manage.py tasks_check --sample 1000         bind more stored arguments per task path

Run it with the code about to be deployed, against the production database: it exits with
status 1 when live tasks would fail under that code."""


class Command(QuietWhenPipeCloses, OneLineWhenUnreachable):
    help = (
        "Check READY and RUNNING tasks against this code: task paths that no longer import, "
        "and stored arguments that no longer bind to the task's signature. Exit 1 if any."
    )

    def get_version(self) -> str:
        return package_version()

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        return super().create_parser(
            prog_name, subcommand, formatter_class=HelpFormatter, epilog=EPILOG, **kwargs
        )

    def add_arguments(self, parser: CommandParser) -> None:
        add_scope_arguments(parser, "Check these queues only (default: every queue).")
        parser.add_argument(
            "--sample",
            metavar="N",
            type=whole_number(1, MAX_SAMPLE),
            default=DEFAULT_SAMPLE,
            help=f"Bind the stored arguments of up to N tasks per task path (default "
            f"{DEFAULT_SAMPLE}, at most {MAX_SAMPLE}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        chosen, queues = chosen_scope(options)
        problems: list[Problem] = []
        tasks = paths = sampled = 0
        for backend in chosen:
            try:
                report = check_live_tasks(backend, queues, options["sample"])
            except DatabaseError as e:
                if is_missing_table(e):
                    raise CommandError(not_migrated(backend.database)) from e
                raise
            problems.extend(report.problems or [])
            tasks, paths, sampled = (
                tasks + report.tasks,
                paths + report.paths,
                sampled + report.sampled,
            )
        self._table(problems)
        checked = (
            f"Checked {tasks} live task(s) of {paths} task path(s); the arguments of "
            f"{sampled} of them were bound (up to {options['sample']} per task path: --sample)."
        )
        if problems:
            stranded = sum(p.ready + p.running for p in problems)
            raise CommandError(
                f"{checked} {len(problems)} task path(s) would strand {stranded} live task(s): "
                "fix the code (keep the old name or signature until they are done), or cancel "
                "those tasks.",
                returncode=1,
            )
        self.stdout.write(f"{checked} No problem found.")

    def _table(self, problems: list[Problem]) -> None:
        if not problems:
            return
        rows = [COLUMNS] + [
            tuple(
                terminal_safe(cell)
                for cell in (
                    p.backend,
                    p.task_path,
                    str(p.ready),
                    str(p.running),
                    p.example_id,
                    p.reason,
                )
            )
            for p in problems
        ]
        # The problem column comes last and is never padded or cut: a pipeline log shows all.
        widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            self.stdout.write("  ".join([*cells, row[-1]]))
