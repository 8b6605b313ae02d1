"""Helpers for testing code that enqueues and runs django-sqltasks tasks.

See docs/testing.md. ``capture_tasks()`` records what a block enqueued; ``run_tasks()`` runs
every due task in the test's process with the worker's own claim, policy and outcome writes;
``advance()`` moves the queue's clock; ``ImmediateSQLTaskBackend`` runs tasks as they are
enqueued. pytest gets the ``sqltasks`` fixture from ``pytest_plugin``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports each on first use
    from .capture import CapturedTasks, capture_tasks
    from .immediate import ImmediateSQLTaskBackend
    from .runner import RunawayTasks, advance, run_tasks

_LAZY = {
    "CapturedTasks": ".capture",
    "capture_tasks": ".capture",
    "ImmediateSQLTaskBackend": ".immediate",
    "RunawayTasks": ".runner",
    "advance": ".runner",
    "run_tasks": ".runner",
}
__all__ = [
    "CapturedTasks",
    "ImmediateSQLTaskBackend",
    "RunawayTasks",
    "advance",
    "capture_tasks",
    "run_tasks",
]


def __getattr__(name: str) -> Any:
    """Import each name on first use (PEP 562), so importing this package loads nothing else."""
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
