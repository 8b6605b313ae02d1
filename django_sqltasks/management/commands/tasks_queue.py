"""``manage.py tasks_queue pause|resume NAME``, ``tasks_queue list``, ``tasks_queue limit NAME
[--concurrency N] [--rate N/PERIOD] [--clear]`` and ``tasks_queue limits``: parse, then hand off
to the backend's ``pause_queue``, ``resume_queue``, ``paused_queues``, ``set_queue_limit``,
``clear_queue_limit`` and ``queue_limits``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...compat import DEFAULT_TASK_BACKEND_ALIAS
from ...core.limits import parse_override, rate_text
from ...exceptions import UnknownQueue
from ..arguments import backend_alias, sql_backend, text
from ..help import package_version
from ..pipes import QuietWhenPipeCloses


def queue_name(value: str) -> str:
    return text(value, "a queue name")


class Command(QuietWhenPipeCloses):
    help = (
        "Pause a queue (its tasks stay READY and no worker claims them; running ones finish), "
        "resume it, or list the paused queues; set, show or clear a queue's limits at run time."
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
        summary = (
            "Override the queue's QUEUE_LIMITS on every worker (from its next limited claim), "
            "show its limits in force and where they come from, or clear the override."
        )
        sub = actions.add_parser("limit", help=summary, description=summary)
        sub.add_argument("queue", type=queue_name, metavar="NAME", help="The queue's name.")
        sub.add_argument(
            "--concurrency",
            metavar="N",
            help="At most N of the queue's tasks RUNNING across every worker (at least 1; to "
            "stop the queue, pause it).",
        )
        sub.add_argument(
            "--rate",
            metavar="N/PERIOD",
            help="At most N starts a second, minute or hour: '10/s', '100/m', '1000/h'.",
        )
        sub.add_argument(
            "--clear",
            action="store_true",
            help="Remove the override: the settings' limits (if any) hold again.",
        )
        actions.add_parser("limits", help="List the limited queues, with each limit's source.")

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
        if action == "limits":
            states = backend.queue_limits()
            if not states:
                self.stdout.write(f"No queue of backend {backend.alias!r} is limited.")
            for state in states:
                self._show(state)
            return
        name = options["queue"]
        if action == "limit":
            self._limit(backend, name, options)
            return
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

    def _limit(self, backend: Any, name: str, options: dict[str, Any]) -> None:
        concurrency, rate, clear = options["concurrency"], options["rate"], options["clear"]
        try:
            if clear:
                if concurrency is not None or rate is not None:
                    raise CommandError("--clear takes no --concurrency or --rate.")
                if backend.clear_queue_limit(name):
                    self.stdout.write(f"Cleared the override of queue {name!r}.")
                else:
                    self.stdout.write(f"Queue {name!r} had no override.")
            elif concurrency is not None or rate is not None:
                limit = parse_override(concurrency, rate, fields=("--concurrency", "--rate"))
                backend.set_queue_limit(name, concurrency=limit.concurrency, rate=rate)
                self.stdout.write(f"Set the override of queue {name!r}.")
        except (UnknownQueue, ValueError) as e:
            raise CommandError(str(e)) from e
        states = {state.queue: state for state in backend.queue_limits()}
        if name in states:
            self._show(states[name])
        else:
            self.stdout.write(f"Queue {name!r} of backend {backend.alias!r} has no limit.")

    def _show(self, state: Any) -> None:
        """Write a queue's limits in force, each with its source (and the settings' value when
        an override replaces it)."""
        self.stdout.write(f"{state.queue}:")
        force, settings = state.in_force, state.settings
        for label, value, source, was in (
            ("concurrency", force.concurrency, state.concurrency_source, settings.concurrency),
            ("rate", rate_text(force), state.rate_source, rate_text(settings)),
        ):
            if value is None:
                self.stdout.write(f"  {label}: none")
                continue
            note = source
            if source == "override":
                note += f"; settings: {was if was is not None else 'none'}"
            self.stdout.write(f"  {label}: {value} ({note})")
