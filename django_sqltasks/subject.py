"""Deprecated: a path the documentation named before the layout by layers. Import from
django_sqltasks.core.subject,
django_sqltasks.task,
django_sqltasks.store.subjects (or from ``django_sqltasks``) instead."""

from __future__ import annotations

import warnings

from .core.subject import Subject
from .store.subjects import cancel_tasks_on_delete
from .task import with_subject

__all__ = ["Subject", "cancel_tasks_on_delete", "with_subject"]

warnings.warn(
    "django_sqltasks.subject moved to "
    "django_sqltasks.core.subject, django_sqltasks.task, django_sqltasks.store.subjects.",
    DeprecationWarning,
    stacklevel=2,
)
