"""Deprecated: a path the documentation named before the layout by layers. Import from
django_sqltasks.core.progress (or from ``django_sqltasks``) instead."""

from __future__ import annotations

import warnings

from .core.progress import SQLTaskContext

__all__ = ["SQLTaskContext"]

warnings.warn(
    "django_sqltasks.progress_report moved to django_sqltasks.core.progress.",
    DeprecationWarning,
    stacklevel=2,
)
