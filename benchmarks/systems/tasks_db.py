"""django-tasks-db, the reference ORM backend for Django Tasks, with its ``db_worker``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.systems.base import Endpoints, System, common_settings, postgres_database, python_m

DATABASE_NAME = "bench_tasks_db"


def _settings(endpoints: Endpoints) -> dict[str, Any]:
    settings = common_settings(endpoints)
    settings["INSTALLED_APPS"] = ["django_tasks_db", "benchmarks.projects"]
    settings["DATABASES"] = {"default": postgres_database(endpoints, DATABASE_NAME)}
    settings["TASKS"] = {
        "default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}
    }
    return settings


def _worker(concurrency: int) -> list[str]:
    # db_worker has no concurrency option: it runs one task at a time.
    return python_m("django", "db_worker", "--queue-name", "default")


def _connect(hit: Callable[[], None]) -> None:
    from django.tasks.signals import task_finished

    def receiver(sender: object, **kwargs: object) -> None:
        hit()

    task_finished.connect(receiver, weak=False, dispatch_uid="bench-completion")


TASKS_DB = System(
    name="tasks-db",
    label="django-tasks-db (PostgreSQL)",
    package="django-tasks-db",
    enqueue_kind="django-tasks",
    async_sleep=False,
    services=("postgresql",),
    worker_argv=_worker,
    django_settings=_settings,
    connect_completion=_connect,
    effective_concurrency=lambda c: 1,
    database=("postgresql", DATABASE_NAME),
)
