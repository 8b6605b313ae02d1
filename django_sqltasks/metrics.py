"""Deprecated: a path the documentation named before the layout by layers. Import from
django_sqltasks.ops.metrics (or from ``django_sqltasks``) instead."""

from __future__ import annotations

import warnings

from .ops.metrics import Metrics

__all__ = ["Metrics"]

warnings.warn(
    "django_sqltasks.metrics moved to django_sqltasks.ops.metrics.",
    DeprecationWarning,
    stacklevel=2,
)
