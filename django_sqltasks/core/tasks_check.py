"""Django's tasks system check, with a backend that cannot be loaded reported as an error.

Django's own check (``django.tasks.checks.check_tasks``, or the backport's) builds every backend
of ``TASKS`` and lets the first one that fails raise, so a typo in a ``BACKEND`` path stops
``manage.py check`` (and ``runserver``, ``migrate``) with a long traceback. This app puts the
check below in its place: each backend that cannot be loaded is one ``E020`` naming its alias,
its path and why, and every other backend is still checked.

Django's URL check imports the URLconf, and with it the views and the tasks they import: a task
declared with ``@task`` builds its backend there, so the same typo failed that check first with
a traceback of its own. The URL check is wrapped too: a backend that cannot be loaded is left to
``E020``, with a warning that the URLconf could not be checked.
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
    """Unregister Django's tasks check (or the backport's) and register ``check_tasks``; wrap
    Django's URL check (``guarded_url_check``)."""
    module = importlib.import_module(f"{type(task_backends).__module__}.checks")
    theirs = getattr(module, "check_tasks", None)
    registered = checks.registry.registry.registered_checks
    if theirs is not None:
        registered.discard(theirs)
    checks.register(check_tasks)
    # Every URL check imports the URLconf (the config, the namespaces, the handlers).
    for url_check in [c for c in registered if checks.Tags.urls in getattr(c, "tags", ())]:
        registered.discard(url_check)
        checks.register(guarded_url_check(url_check), *url_check.tags)


def guarded_url_check(url_check: Any) -> Any:
    """One of Django's URL checks, with a task backend that cannot be loaded while the URLconf
    is imported reported as W021 (E020 names the backend) instead of raised."""

    def guarded(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
        try:
            found: list[checks.CheckMessage] = url_check(app_configs, **kwargs)
        except InvalidTaskBackend as e:
            if url_check.__name__ != "check_url_config":
                return []  # said once, by the check of the URLconf itself
            return [
                checks.Warning(
                    "The URLconf was not checked: importing it declares a task whose backend "
                    f"cannot be loaded ({' '.join(str(e).split())}).",
                    hint="Fix the backend django_sqltasks.E020 names; the URLconf is checked "
                    "again then.",
                    id="django_sqltasks.W021",
                )
            ]
        return found

    return guarded
