"""django-sqltasks (this project) on PostgreSQL, SQLite and MariaDB."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from benchmarks.systems.base import (
    Endpoints,
    Service,
    System,
    common_settings,
    mariadb_database,
    postgres_database,
    python_m,
    sqlite_database,
)

DATABASE_NAME = "bench_sqltasks"
# The server's own port where the endpoints' PostgreSQL port is a pooler's (benchmarks/fleet/).
DIRECT_PORT_ENV = "BENCH_PG_DIRECT_PORT"


def _sqlite_database(endpoints: Endpoints, name: str) -> dict[str, Any]:
    """SQLite as docs/databases.md tells our users to set it up: WAL and a 20 s lock timeout."""
    database = sqlite_database(endpoints, name)
    database["OPTIONS"] = {"init_command": "PRAGMA journal_mode=WAL;", "timeout": 20}
    return database


def _settings(
    database: Callable[[Endpoints, str], dict[str, Any]],
) -> Callable[[Endpoints], dict[str, Any]]:
    def build(endpoints: Endpoints) -> dict[str, Any]:
        settings = common_settings(endpoints)
        settings["INSTALLED_APPS"] = ["django_sqltasks", "benchmarks.projects"]
        settings["DATABASES"] = {"default": database(endpoints, DATABASE_NAME)}
        settings["TASKS"] = {
            "default": {
                "BACKEND": "django_sqltasks.backend.SQLTaskBackend",
                "QUEUES": ["default"],
                "OPTIONS": {},
            }
        }
        direct = os.environ.get(DIRECT_PORT_ENV)
        if direct:
            # Behind a pooler in transaction mode (the fleet profile): the endpoints' port is
            # the pooler's; the one LISTEN of a machine goes straight to the server.
            default = settings["DATABASES"]["default"]
            settings["DATABASES"]["direct"] = {**default, "PORT": int(direct)}
            settings["TASKS"]["default"]["OPTIONS"]["LISTEN_DATABASE"] = "direct"
        return settings

    return build


def _worker(concurrency: int) -> list[str]:
    return python_m(
        "django", "tasks_worker", "--queue", "default", "--concurrency", str(concurrency)
    )


def _connect(hit: Callable[[], None]) -> None:
    from django.tasks.signals import task_finished

    def receiver(sender: object, **kwargs: object) -> None:
        hit()

    task_finished.connect(receiver, weak=False, dispatch_uid="bench-completion")


def _system(
    name: str,
    label: str,
    service: Service | None,
    database: Callable[[Endpoints, str], dict[str, Any]],
) -> System:
    return System(
        name=name,
        label=label,
        package="django-sqltasks",
        enqueue_kind="django-tasks",
        async_sleep=True,
        services=(service,) if service else (),
        worker_argv=_worker,
        django_settings=_settings(database),
        connect_completion=_connect,
        database=(service or "sqlite", DATABASE_NAME),
        supports_bulk=True,
    )


SQLTASKS_PG = _system(
    "sqltasks-pg", "django-sqltasks (PostgreSQL)", "postgresql", postgres_database
)
SQLTASKS_SQLITE = _system("sqltasks-sqlite", "django-sqltasks (SQLite)", None, _sqlite_database)
SQLTASKS_MARIADB = _system(
    "sqltasks-mariadb", "django-sqltasks (MariaDB)", "mariadb", mariadb_database
)
