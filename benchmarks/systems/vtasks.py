"""django-vtasks with its Valkey backend (through django-vcache) and with its database backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.systems.base import (
    Endpoints,
    System,
    common_settings,
    postgres_database,
    python_m,
    redis_url,
)

REDIS_DB = 1
DATABASE_NAME = "bench_vtasks"


def _valkey_settings(endpoints: Endpoints) -> dict[str, Any]:
    settings = common_settings(endpoints)
    settings["INSTALLED_APPS"] = ["django_vtasks", "benchmarks.projects"]
    settings["TASKS"] = {
        "default": {
            "BACKEND": "django_vtasks.backends.valkey.ValkeyTaskBackend",
            "OPTIONS": {"BROKER_URL": redis_url(endpoints, REDIS_DB)},
        }
    }
    settings["VTASKS_QUEUES"] = ["default"]
    return settings


def _db_settings(endpoints: Endpoints) -> dict[str, Any]:
    settings = common_settings(endpoints)
    settings["INSTALLED_APPS"] = ["django_vtasks", "django_vtasks.db", "benchmarks.projects"]
    settings["DATABASES"] = {"default": postgres_database(endpoints, DATABASE_NAME)}
    settings["TASKS"] = {"default": {"BACKEND": "django_vtasks.backends.db.DatabaseTaskBackend"}}
    settings["VTASKS_QUEUES"] = ["default"]
    return settings


def _worker(concurrency: int) -> list[str]:
    return python_m("django", "runworker", "--queue", "default", "--concurrency", str(concurrency))


def _connect(hit: Callable[[], None]) -> None:
    from django_vtasks.signals import task_finished

    # The worker sends this signal with ``asend``; an async receiver avoids a thread hop.
    async def receiver(sender: object, **kwargs: object) -> None:
        hit()

    task_finished.connect(receiver, weak=False, dispatch_uid="bench-completion")


VTASKS_VALKEY = System(
    name="vtasks-valkey",
    label="django-vtasks (Valkey)",
    package="django-vtasks",
    enqueue_kind="django-tasks",
    async_sleep=True,
    services=("redis",),
    worker_argv=_worker,
    django_settings=_valkey_settings,
    connect_completion=_connect,
    redis_db=REDIS_DB,
)

VTASKS_DB = System(
    name="vtasks-db",
    label="django-vtasks (PostgreSQL)",
    package="django-vtasks",
    enqueue_kind="django-tasks",
    async_sleep=True,
    services=("postgresql",),
    worker_argv=_worker,
    django_settings=_db_settings,
    connect_completion=_connect,
    database=("postgresql", DATABASE_NAME),
)
