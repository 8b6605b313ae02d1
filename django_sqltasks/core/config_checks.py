"""The system checks of one backend's configuration (OPTIONS, QUEUES), run by Django's tasks
check through ``SQLTaskBackend.check()``: no database, no models. The checks that query a
database are in ``ops/checks.py``."""

from __future__ import annotations

from collections.abc import Iterable

from django.apps import apps
from django.conf import settings
from django.core import checks

from ..exceptions import InvalidTaskArguments
from . import tracing
from .backends import SQLBackend
from .binding import check_binds
from .columns import MAX_NAME_LENGTH
from .resolve import resolve_task


def check_backend(backend: SQLBackend) -> Iterable[checks.CheckMessage]:
    """Check one backend's configuration (run by Django's tasks check)."""
    name = f"TASKS[{backend.alias!r}]"
    if not apps.is_installed("django_sqltasks"):
        yield checks.Error(
            f"{name} uses django_sqltasks.SQLTaskBackend, but the django_sqltasks app is not "
            "installed.",
            hint="Add 'django_sqltasks' to INSTALLED_APPS, then run migrate.",
            id="django_sqltasks.E001",
        )
    if backend.options_error is not None:
        yield checks.Error(
            str(backend.options_error),
            hint="See the OPTIONS reference in the django-sqltasks documentation.",
            id="django_sqltasks.E002",
        )
        return
    too_long = [q for q in backend.queues if len(q) > MAX_NAME_LENGTH]
    if too_long:
        yield checks.Error(
            f"{name}['QUEUES'] has queue name(s) longer than {MAX_NAME_LENGTH} characters: "
            f"{', '.join(map(repr, too_long))}; no task could be stored in them.",
            hint=f"Shorten them to at most {MAX_NAME_LENGTH} characters.",
            id="django_sqltasks.E004",
        )
    database = backend.config.database
    if database is not None and database not in settings.DATABASES:
        yield checks.Error(
            f"{name}['OPTIONS']['DATABASE'] is {database!r}, which is not in DATABASES.",
            hint=f"Use one of: {', '.join(sorted(settings.DATABASES))}.",
            id="django_sqltasks.E003",
        )
    on_commit = backend.config.enqueue_on_commit
    if isinstance(on_commit, str) and on_commit not in settings.DATABASES:
        yield checks.Error(
            f"{name}['OPTIONS']['ENQUEUE_ON_COMMIT'] is {on_commit!r}, which is not in DATABASES.",
            hint="Name the database whose transactions the enqueue should wait for, or use True.",
            id="django_sqltasks.E006",
        )
    if backend.config.tracing and not tracing.available():
        yield checks.Error(
            f"{name}['OPTIONS']['TRACING'] is True, but the OpenTelemetry API is not "
            "installed: no span is made.",
            hint="pip install 'django-sqltasks[otel]' (and the OpenTelemetry SDK to export).",
            id="django_sqltasks.E012",
        )
    unknown = sorted(set(backend.config.queue_limits) - set(backend.queues))
    if backend.queues and unknown:
        yield checks.Error(
            f"{name}['OPTIONS']['QUEUE_LIMITS'] limits {', '.join(map(repr, unknown))}, which "
            f"is not in QUEUES: no task can be in it, so the limit would hold nothing.",
            hint=f"Use one of QUEUES ({', '.join(backend.queues)}), or add the queue to it.",
            id="django_sqltasks.E013",
        )
    yield from _check_periodic(backend, name)


def _check_periodic(backend: SQLBackend, name: str) -> Iterable[checks.CheckMessage]:
    for schedule in backend.config.periodic.values():
        try:
            task = resolve_task(schedule.task_path, backend=backend.alias)
        except Exception as e:
            yield checks.Error(
                f"{name}['OPTIONS']['PERIODIC'][{schedule.name!r}]: {e}",
                hint="Point 'task' at a function decorated with @task.",
                id="django_sqltasks.E005",
            )
            continue
        try:
            check_binds(task, schedule.args, schedule.kwargs)
        except InvalidTaskArguments as e:
            yield checks.Error(
                f"{name}['OPTIONS']['PERIODIC'][{schedule.name!r}]: {e}",
                hint="Give 'args' and 'kwargs' that the task's function takes.",
                id="django_sqltasks.E005",
            )
        queue = schedule.queue_name
        if queue is not None and backend.queues and queue not in backend.queues:
            yield checks.Error(
                f"{name}['OPTIONS']['PERIODIC'][{schedule.name!r}]['queue_name'] is "
                f"{queue!r}, which is not in QUEUES.",
                hint=f"Use one of QUEUES ({', '.join(backend.queues)}), or add it.",
                id="django_sqltasks.E005",
            )
