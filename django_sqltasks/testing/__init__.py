"""Helpers for testing code that enqueues and runs django-sqltasks tasks.

See docs/testing.md. ``capture_tasks()`` records what a block enqueued; ``run_tasks()`` runs
every due task in the test's process with the worker's own claim, policy and outcome writes;
``advance()`` moves the queue's clock; ``ImmediateSQLTaskBackend`` runs tasks as they are
enqueued. pytest gets the ``sqltasks`` fixture from ``pytest_plugin``.
"""

from .capture import CapturedTasks, capture_tasks
from .immediate import ImmediateSQLTaskBackend
from .runner import RunawayTasks, advance, run_tasks

__all__ = [
    "CapturedTasks",
    "ImmediateSQLTaskBackend",
    "RunawayTasks",
    "advance",
    "capture_tasks",
    "run_tasks",
]
