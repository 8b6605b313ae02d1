"""``manage.py tasks_partition``: parse the options, then hand off to ``store.partitions``."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import connections

from ...compat import DEFAULT_TASK_BACKEND_ALIAS
from ...sql import dialect_for
from ...store import partitions
from ..arguments import backend_alias, positive_int, sql_backend
from ..help import package_version
from ..startup import OneLineWhenUnreachable


class Command(OneLineWhenUnreachable):
    help = (
        "PostgreSQL: convert the task table to the partitioned layout while workers run. Builds "
        "the new table beside the old one, swaps them in one short transaction that moves the "
        "live tasks, then moves the finished tasks in batches."
    )

    def get_version(self) -> str:
        return package_version()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend",
            type=backend_alias,
            default=DEFAULT_TASK_BACKEND_ALIAS,
            metavar="ALIAS",
            help="The TASKS alias whose database to convert (default: 'default').",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=partitions.MOVE_BATCH,
            metavar="N",
            help=f"Finished tasks moved per transaction (default: {partitions.MOVE_BATCH}).",
        )
        parser.add_argument(
            "--history-days",
            type=positive_int,
            default=partitions.HISTORY_DAYS,
            metavar="DAYS",
            help="Days back given a partition each; older finished tasks go to the default "
            f"partition, which pruning deletes from (default: {partitions.HISTORY_DAYS}).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Print the statements of the build and the swap; change nothing.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        backend = sql_backend(options["backend"])
        connection = connections[backend.database]
        if not dialect_for(connection).partitions_tasks:
            raise CommandError(
                f"Database {backend.database!r} is {connection.display_name}: only PostgreSQL "
                "partitions the task table; pruning deletes elsewhere (docs/databases.md)."
            )
        state = partitions.conversion_state(connection)
        dry_run = options["dry_run"]
        say = self.stdout.write if dry_run or options["verbosity"] > 1 else None
        if state == "missing":
            raise CommandError("The task table does not exist: run 'manage.py migrate'.")
        if state == "plain":
            started = time.monotonic()
            self.stdout.write("Building the partitioned table beside the task table...")
            partitions.build(
                connection, history_days=options["history_days"], say=say, dry_run=dry_run
            )
            self.stdout.write("Swapping the tables and moving the live tasks...")
            partitions.swap(connection, say=say, dry_run=dry_run)
            if dry_run:
                self.stdout.write("Dry run: nothing was changed.")
                return
            self.stdout.write(f"Swapped in {time.monotonic() - started:.1f}s.")
        elif state == "partitioned":
            self.stdout.write("The task table is partitioned already.")
            return
        if dry_run:
            self.stdout.write("Would move the finished tasks left in the old table.")
            return
        started = time.monotonic()
        moved = partitions.move_history(
            connection,
            batch_size=options["batch_size"],
            on_batch=lambda n: self.stdout.write(f"  {n} finished tasks moved"),
        )
        self.stdout.write(
            f"Moved {moved} finished tasks in {time.monotonic() - started:.1f}s; "
            "the task table is partitioned."
        )
        # The new table's indexes have no statistics yet (autovacuum never analyses a
        # partitioned table itself): without those of the search index's expression, the
        # planner guessed 1% of 48M tasks matched a search and read the primary key instead.
        started = time.monotonic()
        partitions.analyze(connection)
        self.stdout.write(f"Analysed the table in {time.monotonic() - started:.1f}s.")
