"""System checks: the app, the OPTIONS and QUEUES, the database and its version, stuck queues."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.core import checks
from django.db import DatabaseError, InterfaceError, OperationalError

from ..core.backends import sql_backends
from ..sql import unsupported_version
from ..sql.installation import (
    not_migrated,
    running_migrate,
    unapplied_migrations,
    unreachable,
)
from . import health
from .horizon import OLD_TRANSACTION_SECONDS, setting_problem

STUCK_AFTER = timedelta(minutes=5)  # how long due tasks wait, unserved, before a warning


@checks.register(checks.Tags.database)
def check_database_versions(
    app_configs: Sequence[Any] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> Iterable[checks.CheckMessage]:
    """Refuse database servers too old for the claim query (runs with ``--database``/migrate),
    and say in one line which database cannot be reached (the other database checks then pass
    it by)."""
    for alias in databases or []:
        try:
            message = unsupported_version(alias)
        except (OperationalError, InterfaceError) as e:  # a refused or lost connection
            yield checks.Error(
                unreachable(alias, e),
                hint="Start the database server, or correct DATABASES; then check again.",
                id="django_sqltasks.E014",
            )
            continue
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
    if not apps.is_installed("django_sqltasks") or running_migrate():
        return
    holding_tasks = {backend.database for backend in sql_backends().values()}
    for alias in databases or []:
        if alias not in holding_tasks:
            continue
        try:
            unapplied = unapplied_migrations(alias)
        except (OperationalError, InterfaceError):
            continue  # unreachable: check_database_versions says so
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
    # Start-up: only this check needs the overview's module, and workers never run it.
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
