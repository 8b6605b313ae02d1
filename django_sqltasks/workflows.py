"""Deprecated: a path the documentation named before the layout by layers. Import from
django_sqltasks.core.workflows (or from ``django_sqltasks``) instead."""

from __future__ import annotations

import warnings

from .core.workflows import (
    Signature,
    WorkflowResult,
    chain,
    get_workflow,
    group,
    signature,
    workflow_of,
)

__all__ = [
    "Signature",
    "WorkflowResult",
    "chain",
    "get_workflow",
    "group",
    "signature",
    "workflow_of",
]

warnings.warn(
    "django_sqltasks.workflows moved to django_sqltasks.core.workflows.",
    DeprecationWarning,
    stacklevel=2,
)
