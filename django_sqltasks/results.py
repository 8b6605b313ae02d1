"""Deprecated: a path the documentation named before the layout by layers. Import from
django_sqltasks.task (or from ``django_sqltasks``) instead."""

from __future__ import annotations

import warnings

from .task import MissingTask, SQLTaskResult

__all__ = ["MissingTask", "SQLTaskResult"]

warnings.warn(
    "django_sqltasks.results moved to django_sqltasks.task.",
    DeprecationWarning,
    stacklevel=2,
)
