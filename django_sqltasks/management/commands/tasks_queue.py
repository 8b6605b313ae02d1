"""``manage.py tasks_queue pause|resume NAME`` and ``tasks_queue list``: parse, then hand off to
the backend's ``pause_queue``, ``resume_queue`` and ``paused_queues``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...compat import DEFAULT_TASK_BACKEND_ALIAS
from ...exceptions import UnknownQueue
from ..arguments import backend_alias, sql_backend, text
from ..help import package_version


def queue_name(value: str) -> str:
    return text(value, "a queue name")


class Command(BaseCommand):
    help = (
        "Pause a queue (its tasks stay READY and no worker claims them; running ones finish), "
        "resume it, or list the paused queues."
    )

    def get_version(self) -> str:
        return package_version()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend",
            type=backend_alias,
            default=DEFAULT_TASK_BACKEND_ALIAS,
            metavar="ALIAS",
            help="The TASKS alias whose queues to act on (default: 'default').",
        )
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        for action, summary in (
            ("pause", "Stop every worker claiming the queue's tasks."),
            ("resume", "Let workers claim the queue's tasks again."),
        ):
            sub = actions.add_parser(action, help=summary, description=summary)
            sub.add_argument("queue", type=queue_name, metavar="NAME", help="The queue's name.")
        actions.add_parser("list", help="List the paused queues.")

    def handle(self, *args: Any, **options: Any) -> None:
        backend = sql_backend(options["backend"])
        action = options["action"]
        if action == "list":
            names = backend.paused_queues()
            if not names:
                self.stdout.write(f"No queue of backend {backend.alias!r} is paused.")
            for name in names:
                self.stdout.write(name)
            return
        name = options["queue"]
        try:
            if action == "pause":
                changed = backend.pause_queue(name)
                done, already = "Paused", "was paused already"
            else:
                changed = backend.resume_queue(name)
                done, already = "Resumed", "was not paused"
        except UnknownQueue as e:
            raise CommandError(str(e)) from e
        if changed:
            self.stdout.write(f"{done} queue {name!r} of backend {backend.alias!r}.")
        else:
            self.stdout.write(f"Queue {name!r} of backend {backend.alias!r} {already}.")
