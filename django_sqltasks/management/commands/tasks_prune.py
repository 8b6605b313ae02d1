"""``manage.py tasks_prune``: parse the options, then hand off to ``pruning.prune``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from ...compat import DEFAULT_TASK_BACKEND_ALIAS
from ...models import TaskRecord
from ...store.pruning import (
    BATCH_SIZE,
    DEFAULT_FAILED_DAYS,
    DEFAULT_SUCCESSFUL_DAYS,
    DEFAULT_UNCLAIMED_EVENT_DAYS,
    prune,
)
from ..arguments import backend_alias, days, positive_int, refuse_unknown_queues, sql_backend, text
from ..help import package_version
from ..pipes import QuietWhenPipeCloses
from ..startup import OneLineWhenUnreachable


def queue_name(value: str) -> str:
    return text(value, "a queue name")


class Command(QuietWhenPipeCloses, OneLineWhenUnreachable):
    help = "Delete finished tasks older than a number of days, in small batches."

    def get_version(self) -> str:
        return package_version()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--days",
            type=days,
            default=DEFAULT_SUCCESSFUL_DAYS,
            metavar="DAYS",
            help="Delete SUCCESSFUL tasks finished more than this many days ago "
            f"(default: {DEFAULT_SUCCESSFUL_DAYS:g}).",
        )
        parser.add_argument(
            "--failed-days",
            type=days,
            default=DEFAULT_FAILED_DAYS,
            metavar="DAYS",
            help="Delete FAILED tasks finished more than this many days ago "
            f"(default: {DEFAULT_FAILED_DAYS:g}).",
        )
        parser.add_argument(
            "--unclaimed-event-days",
            type=days,
            default=DEFAULT_UNCLAIMED_EVENT_DAYS,
            metavar="DAYS",
            help="Delete events sent more than this many days ago for a key no task waits for, "
            "on the backend's database; not with --queue "
            f"(default: {DEFAULT_UNCLAIMED_EVENT_DAYS:g}).",
        )
        parser.add_argument(
            "--backend",
            type=backend_alias,
            default=DEFAULT_TASK_BACKEND_ALIAS,
            metavar="ALIAS",
            help="The TASKS alias whose tasks to prune (default: 'default').",
        )
        parser.add_argument(
            "--queue",
            type=queue_name,
            metavar="NAME",
            help="Prune this queue only; '*' means every queue, as for tasks_worker (default: "
            "every queue).",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=BATCH_SIZE,
            metavar="N",
            help=f"Rows deleted per statement (default: {BATCH_SIZE}).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )
        parser.add_argument(
            "--exact",
            action="store_true",
            help="PostgreSQL: also delete, in batches, the old tasks of the day the cutoff falls "
            "in (by default they are kept until that whole day is past the cutoff, at most a "
            "day longer, and then dropped with its partition).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        backend = sql_backend(options["backend"])
        queue = None if options["queue"] == "*" else options["queue"]
        if queue is not None:
            refuse_unknown_queues(backend, [queue])
        pruned = prune(
            using=backend.database,
            successful_days=options["days"],
            failed_days=options["failed_days"],
            backend=backend.alias,
            queue=queue,
            batch_size=options["batch_size"],
            dry_run=options["dry_run"],
            exact=options["exact"],
            # Events belong to no queue: a queue's pruning leaves them.
            unclaimed_event_days=options["unclaimed_event_days"] if queue is None else None,
        )
        if queue is not None and not pruned.total:
            tasks = TaskRecord.objects.using(backend.database).filter(backend_name=backend.alias)
            if not tasks.filter(queue_name=queue).exists():
                self.stderr.write(f"No task of backend {backend.alias!r} is in queue {queue!r}.")
        verb = "Would delete" if options["dry_run"] else "Deleted"
        self.stdout.write(
            f"{verb} {pruned.total} task(s): {pruned.successful} successful finished over "
            f"{options['days']:g} days ago, {pruned.failed} failed finished over "
            f"{options['failed_days']:g} days ago."
        )
        if pruned.workflows:
            self.stdout.write(f"{verb} {pruned.workflows} finished workflow(s) as old.")
        if pruned.events:
            self.stdout.write(
                f"{verb} {pruned.events} unclaimed event(s) sent over "
                f"{options['unclaimed_event_days']:g} days ago."
            )
        if pruned.kept_until is not None:
            self.stdout.write(
                "Kept the tasks past the cutoff that finished on the day it falls in: they go "
                f"with that day's partition after {pruned.kept_until:%Y-%m-%d %H:%M} UTC. "
                "--exact deletes them now."
            )
