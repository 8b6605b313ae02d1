"""What keeps any task from running before a database is read: the ``TASKS`` setting and the
backends it names (``tasks_health`` reports these with exit status 1)."""

from __future__ import annotations

from django.conf import settings

from ..compat import InvalidTaskBackend, task_backends
from ..core.backends import SQLBackend, sql_backends
from ..core.tasks_check import OUR_PATHS, unloadable
from .health import one_line
from .probe_report import Exit, Problem


def configuration_problems(backends: list[SQLBackend]) -> list[Problem]:
    """What keeps anything from running before a database is read: a ``TASKS`` entry whose
    backend cannot be loaded (a typo in ``BACKEND``), no backend of this package at all (no
    ``TASKS`` setting, or one that names none), and a chosen backend that refuses to enqueue
    (its ``OPTIONS`` break a rule, or the app is not in ``INSTALLED_APPS``)."""
    found = [
        Problem(Exit.MISCONFIGURED, alias, one_line(message), code="backend_unloadable")
        for alias, message in unloadable_backends()
    ]
    if not found and not sql_backends():
        configured = (
            ", ".join(
                f"{alias!r} is {entry.get('BACKEND', '?') if isinstance(entry, dict) else '?'}"
                for alias, entry in settings.TASKS.items()
            )
            or "none"
        )
        found.append(
            Problem(
                Exit.MISCONFIGURED,
                None,
                "No TASKS backend is a django_sqltasks backend, so no task is stored for a "
                f"worker to run (TASKS: {configured}). Set BACKEND to "
                f"{OUR_PATHS[0]!r} (docs/quickstart.md).",
                code="no_backend",
            )
        )
    for backend in backends:
        try:
            backend.check_usable()
        except InvalidTaskBackend as e:
            found.append(
                Problem(
                    Exit.MISCONFIGURED, backend.alias, one_line(str(e)), code="backend_unusable"
                )
            )
    return found


def unloadable_backends() -> list[tuple[str, str]]:
    """Each ``TASKS`` alias whose backend cannot be loaded, and the E020 check's message."""
    found = []
    for alias in settings.TASKS:
        try:
            task_backends[alias]
        except InvalidTaskBackend as e:
            error = unloadable(alias, e)
            found.append((alias, f"{error.msg.rstrip('.')}. {error.hint}"))
    return found
