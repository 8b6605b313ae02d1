"""Django's tasks system check, with a backend that cannot be loaded reported as an error.

Django's own check (``django.tasks.checks.check_tasks``, or the backport's) builds every backend
of ``TASKS`` and lets the first one that fails raise, so a typo in a ``BACKEND`` path stops
``manage.py check`` (and ``runserver``, ``migrate``) with a long traceback. This app puts the
check below in its place: each backend that cannot be loaded is one ``E020`` naming its alias,
its path and why, and every other backend is still checked.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core import checks

from ..compat import InvalidTaskBackend, task_backends

OUR_PATHS = ("django_sqltasks.backend.SQLTaskBackend", "django_sqltasks.SQLTaskBackend")


def check_tasks(app_configs: Any = None, **kwargs: Any) -> Iterable[checks.CheckMessage]:
    """Check every backend of ``TASKS``; one that cannot be loaded is an error, not a crash."""
    for alias in settings.TASKS:
        try:
            backend = task_backends[alias]
        except InvalidTaskBackend as e:
            yield unloadable(alias, e)
            continue
        yield from backend.check()


def unloadable(alias: str, error: BaseException) -> checks.Error:
    """The ``E020`` error of a ``TASKS`` entry whose backend cannot be loaded."""
    entry = settings.TASKS[alias]
    path = str(entry.get("BACKEND", "")) if isinstance(entry, dict) else ""
    cause = error.__cause__ or error
    if path.startswith("django_sqltasks"):
        hint = f"This package's backend is {OUR_PATHS[0]!r} (or {OUR_PATHS[1]!r})."
    else:
        hint = "Check the dotted path, and that its package is installed."
    return checks.Error(
        f"TASKS[{alias!r}]['BACKEND'] is {path!r}, which cannot be loaded: {cause}",
        hint=hint,
        id="django_sqltasks.E020",
    )


def replace_djangos_check() -> None:
    """Unregister Django's tasks check (or the backport's) and register ``check_tasks``."""
    module = importlib.import_module(f"{type(task_backends).__module__}.checks")
    theirs = getattr(module, "check_tasks", None)
    registered = checks.registry.registry.registered_checks
    if theirs is not None:
        registered.discard(theirs)
    checks.register(check_tasks)
