"""``manage.py tasks_status``: every queue's counts and backlog, and the live workers."""

from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from ...core.backends import sql_backends
from ...ops import health, overview
from ...sql.installation import is_missing_table, not_migrated
from ..help import package_version, terminal_safe
from ..pipes import QuietWhenPipeCloses
from ..startup import OneLineWhenUnreachable

QUEUE_COLUMNS = (
    "backend",
    "queue",
    "due",
    "scheduled",
    "running",
    "succeeded 1h",
    "failed 1h",
    "oldest due",
    "served",
    "paused",
    "limited",
)
WORKER_COLUMNS = ("worker", "host", "pid", "queues", "running", "last heartbeat")


class Command(QuietWhenPipeCloses, OneLineWhenUnreachable):
    help = "Show each queue's counts and backlog age, and the live workers."

    def get_version(self) -> str:
        return package_version()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend", metavar="ALIAS", help="Show this TASKS alias only (default: all)."
        )
        parser.add_argument(
            "--plain",
            action="store_true",
            help="Plain text even on a terminal with rich installed (output that is not a "
            "terminal is always plain, never cut to a width).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        backends = sql_backends()
        if options["backend"] is not None:
            if options["backend"] not in backends:
                known = ", ".join(sorted(backends)) or "none"
                raise CommandError(
                    f"--backend: {options['backend']!r} is not a django_sqltasks backend "
                    f"(those configured: {known})."
                )
            backends = {options["backend"]: backends[options["backend"]]}
        queue_rows: list[tuple[str, ...]] = []
        worker_rows: list[tuple[str, ...]] = []
        database_lines: list[str] = []
        for database in sorted({b.database for b in backends.values()}):
            names = [a for a, b in backends.items() if b.database == database]
            try:
                snapshot = overview.take(
                    using=database,
                    backend=names[0] if len(names) == 1 else None,
                    configured={alias: backends[alias].queues for alias in names},
                )
            except DatabaseError as e:
                if is_missing_table(e):
                    raise CommandError(not_migrated(database)) from e
                raise
            queue_rows.extend(
                (
                    q.backend,
                    q.queue,
                    str(q.due),
                    str(q.scheduled),
                    str(q.running),
                    str(q.succeeded),
                    str(q.failed),
                    overview.short_age(q.oldest_age(snapshot.now)),
                    "yes" if q.served else "NO",
                    "PAUSED" if q.paused else "no",
                    str(q.limited),
                )
                for q in snapshot.queues
                if q.backend in names
            )
            worker_rows.extend(
                (
                    w.id,
                    w.hostname,
                    str(w.pid or ""),
                    ",".join(w.queues),
                    f"{w.running}/{w.concurrency}",
                    overview.short_age(snapshot.now - w.heartbeat_at) + " ago",
                )
                for w in snapshot.workers
                if w.backend in names
            )
            database_lines.extend(self._upkeep(database, snapshot))
        # Piped or redirected, a table is read by a program or a wider screen: rich would cut
        # it to 80 columns there, so only a terminal gets rich's boxes.
        if find_spec("rich") is not None and not options["plain"] and self.stdout.isatty():
            self._rich(queue_rows, worker_rows)
        else:
            self._plain("Queues", QUEUE_COLUMNS, queue_rows)
            self._plain("Workers", WORKER_COLUMNS, worker_rows)
        if database_lines:
            self.stdout.write("Task table")
            self.stdout.write("\n".join(database_lines))

    def _upkeep(self, database: str, snapshot: overview.Overview) -> list[str]:
        """Lines on the task table's upkeep on ``database``: a summary, then each warning."""
        line = health.summary(snapshot.health)
        lines = [f"  {database}: {line}"] if line else []
        for warning in snapshot.warnings:
            lines.append(f"  WARNING {warning.check_id}: {warning.message}")
            lines.append(f"    Hint: {warning.hint}")
        return lines

    def _plain(self, title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
        self.stdout.write(title)
        if not rows:
            self.stdout.write("  (none)\n")
            return
        rows = [tuple(terminal_safe(value) for value in row) for row in rows]
        widths = [max(len(r[i]) for r in [columns, *rows]) for i in range(len(columns))]
        for row in [columns, *rows]:
            self.stdout.write(
                "  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
            )
        self.stdout.write("")

    def _rich(self, queue_rows: list[tuple[str, ...]], worker_rows: list[tuple[str, ...]]) -> None:
        # rich is optional and may be absent where mypy runs: import it by name.
        console = import_module("rich.console").Console(file=self.stdout)
        Table = import_module("rich.table").Table
        for title, columns, rows in (
            ("Queues", QUEUE_COLUMNS, queue_rows),
            ("Workers", WORKER_COLUMNS, worker_rows),
        ):
            table = Table(title=title, title_justify="left")
            for column in columns:
                table.add_column(column, overflow="fold")  # wrap a long name; never cut it
            Text = import_module("rich.text").Text  # plain text: a stored "[red]" is not markup
            for row in rows:
                table.add_row(*(Text(terminal_safe(value)) for value in row))
            console.print(table)
