"""Deprecated: a path the documentation named before the layout by layers. Import from
django_sqltasks.admin.subject (or from ``django_sqltasks``) instead."""

from __future__ import annotations

import warnings

from .admin.subject import SubjectTasksMixin

__all__ = ["SubjectTasksMixin"]

warnings.warn(
    "django_sqltasks.admin_subject moved to django_sqltasks.admin.subject.",
    DeprecationWarning,
    stacklevel=2,
)
