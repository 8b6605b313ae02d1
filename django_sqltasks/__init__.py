"""django-sqltasks: a Django Tasks backend that keeps every task in the project's database.

The names below are imported on first use, so ``import django_sqltasks`` (as Django does for
``INSTALLED_APPS``, and pytest for the plugin) loads no other module of the package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports each on first use
    from .backend import SQLTaskBackend
    from .core.progress import SQLTaskContext
    from .core.workflows import chain, get_workflow, group, signature, workflow_of
    from .exceptions import EventTimeout, Snooze
    from .store.events import asend_event, send_event
    from .store.subjects import cancel_tasks_on_delete
    from .task import with_subject

__version__ = "0.1.0"

_LAZY = {
    "SQLTaskBackend": ".backend",
    "Snooze": ".exceptions",
    "SQLTaskContext": ".core.progress",
    "chain": ".core.workflows",
    "group": ".core.workflows",
    "signature": ".core.workflows",
    "get_workflow": ".core.workflows",
    "workflow_of": ".core.workflows",
    "with_subject": ".task",
    "cancel_tasks_on_delete": ".store.subjects",
    "send_event": ".store.events",
    "asend_event": ".store.events",
    "EventTimeout": ".exceptions",
}
__all__ = [
    "EventTimeout",
    "SQLTaskBackend",
    "SQLTaskContext",
    "Snooze",
    "asend_event",
    "cancel_tasks_on_delete",
    "chain",
    "get_workflow",
    "group",
    "send_event",
    "signature",
    "with_subject",
    "workflow_of",
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
