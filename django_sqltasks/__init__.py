"""django-sqltasks: a Django Tasks backend that keeps every task in the project's database.

The names below are imported on first use, so ``import django_sqltasks`` (as Django does for
``INSTALLED_APPS``, and pytest for the plugin) loads no other module of the package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports each on first use
    from .admin.subject import SubjectTasksMixin
    from .backend import SQLTaskBackend
    from .core.durable import SentEvent
    from .core.error_text import error_summary
    from .core.progress import SQLTaskContext
    from .core.subject import Subject
    from .core.workflows import (
        Signature,
        WorkflowResult,
        chain,
        get_workflow,
        group,
        signature,
        workflow_of,
    )
    from .embedded import EmbeddedWorker, embed_in_asgi, embed_in_wsgi
    from .exceptions import EventTimeout, Snooze
    from .ops.metrics import Metrics
    from .store.events import asend_event, send_event
    from .store.query import Cancelled, TaskQuery
    from .store.subjects import cancel_ready_tasks, cancel_tasks_on_delete
    from .task import MissingTask, SQLTask, SQLTaskResult, with_subject

__version__ = "0.1.0"

# Every name the documentation shows, and the module it lives in. Exceptions are imported from
# django_sqltasks.exceptions, models from django_sqltasks.models, test helpers from
# django_sqltasks.testing and the worker from django_sqltasks.worker (docs/tasks.md, "Imports").
_LAZY = {
    "SQLTaskBackend": ".backend",
    "SQLTask": ".task",
    "SQLTaskResult": ".task",
    "MissingTask": ".task",
    "with_subject": ".task",
    "Snooze": ".exceptions",
    "SQLTaskContext": ".core.progress",
    "Subject": ".core.subject",
    "error_summary": ".core.error_text",
    "Signature": ".core.workflows",
    "WorkflowResult": ".core.workflows",
    "chain": ".core.workflows",
    "group": ".core.workflows",
    "signature": ".core.workflows",
    "get_workflow": ".core.workflows",
    "workflow_of": ".core.workflows",
    "cancel_tasks_on_delete": ".store.subjects",
    "cancel_ready_tasks": ".store.subjects",
    "Metrics": ".ops.metrics",
    "SubjectTasksMixin": ".admin.subject",
    "EmbeddedWorker": ".embedded",
    "embed_in_asgi": ".embedded",
    "embed_in_wsgi": ".embedded",
    "TaskQuery": ".store.query",
    "Cancelled": ".store.query",
    "send_event": ".store.events",
    "asend_event": ".store.events",
    "SentEvent": ".core.durable",
    "EventTimeout": ".exceptions",
}
__all__ = [
    "Cancelled",
    "EmbeddedWorker",
    "EventTimeout",
    "Metrics",
    "MissingTask",
    "SQLTask",
    "SQLTaskBackend",
    "SQLTaskContext",
    "SQLTaskResult",
    "SentEvent",
    "Signature",
    "Snooze",
    "Subject",
    "SubjectTasksMixin",
    "TaskQuery",
    "WorkflowResult",
    "asend_event",
    "cancel_ready_tasks",
    "cancel_tasks_on_delete",
    "chain",
    "embed_in_asgi",
    "embed_in_wsgi",
    "error_summary",
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
