"""System checks: the app, the OPTIONS and QUEUES, the database and its version, stuck queues."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import DatabaseError

from ..sql import unsupported_version

if TYPE_CHECKING:
    from ..backend import SQLTaskBackend

# Oldest supported server versions, and why.
MAX_QUEUE_NAME_LENGTH = 64  # TaskRecord.queue_name
STUCK_AFTER = timedelta(minutes=5)  # how long due tasks wait, unserved, before a warning


def check_backend(backend: SQLTaskBackend) -> Iterable[checks.CheckMessage]:
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
    too_long = [q for q in backend.queues if len(q) > MAX_QUEUE_NAME_LENGTH]
    if too_long:
        yield checks.Error(
            f"{name}['QUEUES'] has queue name(s) longer than {MAX_QUEUE_NAME_LENGTH} characters: "
            f"{', '.join(map(repr, too_long))}; no task could be stored in them.",
            hint=f"Shorten them to at most {MAX_QUEUE_NAME_LENGTH} characters.",
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
    if backend.config.tracing:
        from ..core import tracing as otel

        if not otel.available():
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


def _check_periodic(backend: SQLTaskBackend, name: str) -> Iterable[checks.CheckMessage]:
    from ..core.resolve import resolve_task

    for schedule in backend.config.periodic.values():
        try:
            resolve_task(schedule.task_path, backend=backend.alias)
        except Exception as e:
            yield checks.Error(
                f"{name}['OPTIONS']['PERIODIC'][{schedule.name!r}]: {e}",
                hint="Point 'task' at a function decorated with @task.",
                id="django_sqltasks.E005",
            )


@checks.register(checks.Tags.database)
def check_database_versions(
    app_configs: Sequence[Any] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> Iterable[checks.CheckMessage]:
    """Refuse database servers too old for the claim query (runs with ``--database``/migrate)."""
    for alias in databases or []:
        message = unsupported_version(alias)
        if message:
            yield checks.Error(message, id="django_sqltasks.E010")


@checks.register(checks.Tags.database)
def check_migrated(
    app_configs: Sequence[Any] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> Iterable[checks.CheckMessage]:
    """Warn when a database that holds tasks lacks some of this app's migrations.

    A warning, not an error: ``migrate`` runs these checks before it migrates, and an error
    would stop it from applying the very migrations it names.
    """
    from ..admin.lists import sql_backends
    from ..sql.installation import not_migrated, running_migrate, unapplied_migrations

    if not apps.is_installed("django_sqltasks") or running_migrate():
        return
    holding_tasks = {backend.database for backend in sql_backends().values()}
    for alias in databases or []:
        if alias not in holding_tasks:
            continue
        unapplied = unapplied_migrations(alias)
        if unapplied:
            yield checks.Warning(
                not_migrated(alias, unapplied) + " Until then tasks cannot be enqueued or run.",
                id="django_sqltasks.W002",
            )


@checks.register(checks.Tags.database)
def check_unserved_queues(
    app_configs: Sequence[Any] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> Iterable[checks.CheckMessage]:
    """Warn of queues whose due tasks have waited long while no live worker takes that queue.

    Which queues a task names is known only once it is enqueued (Django refuses a queue_name
    outside a non-empty QUEUES when the task is defined), and which queues workers take only
    once they run: so this reads the task and worker tables, and runs with ``--database``.
    """
    from . import overview

    for alias in databases or []:
        if not apps.is_installed("django_sqltasks"):
            return
        try:
            snapshot = overview.take(using=alias, minutes=1, health=False)
        except DatabaseError:
            continue  # not migrated yet: nothing is waiting
        for queue in snapshot.queues:
            age = queue.oldest_age(snapshot.now)
            if queue.paused or queue.served or age is None or age < STUCK_AFTER:
                # A paused queue waits on purpose: the overview and the metrics show it.
                continue
            yield checks.Warning(
                f"Queue {queue.queue!r} of backend {queue.backend!r} has {queue.due} due task(s), "
                f"the oldest waiting {int(age.total_seconds() // 60)} minutes, and no live worker "
                "takes that queue.",
                hint=f"Start a worker with 'manage.py tasks_worker --backend {queue.backend} "
                f"--queue {queue.queue}' (or --queue '*'), or add {queue.queue!r} to the "
                "--queue options of a running worker.",
                id="django_sqltasks.W001",
            )


@checks.register()
def check_health_setting(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> Iterable[checks.CheckMessage]:
    """Refuse a SQLTASKS_OLD_TRANSACTION_SECONDS that is not a positive number of seconds."""
    from .health import OLD_TRANSACTION_SECONDS, setting_problem

    problem = setting_problem()
    if problem:
        yield checks.Error(
            problem,
            hint=f"Set a number of seconds, or remove it (default {OLD_TRANSACTION_SECONDS:g}).",
            id="django_sqltasks.E011",
        )


@checks.register(checks.Tags.database)
def check_table_health(
    app_configs: Sequence[Any] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> Iterable[checks.CheckMessage]:
    """Warn when the task table's dead rows cannot be cleaned up: autovacuum is off for it,
    they outnumber the live rows, or an old transaction holds the cleanup back."""
    from ..admin.lists import sql_backends
    from . import health

    if not apps.is_installed("django_sqltasks"):
        return
    holding_tasks = {backend.database for backend in sql_backends().values()}
    for alias in databases or []:
        if alias not in holding_tasks:
            continue
        try:
            found = health.warnings(health.read(alias), alias)
        except DatabaseError:
            continue  # unreachable or not migrated: other checks say so
        for warning in found:
            yield checks.Warning(warning.message, hint=warning.hint, id=warning.check_id)
