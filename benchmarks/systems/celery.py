"""Celery 5 with the threads pool and a Redis broker, results ignored."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.systems.base import Endpoints, System, common_settings, python_m, redis_url

REDIS_DB = 2


def _settings(endpoints: Endpoints) -> dict[str, Any]:
    settings = common_settings(endpoints)
    settings["INSTALLED_APPS"] = ["benchmarks.projects"]
    settings["CELERY_BROKER_URL"] = redis_url(endpoints, REDIS_DB)
    settings["CELERY_TASK_IGNORE_RESULT"] = True
    return settings


def _worker(concurrency: int) -> list[str]:
    return python_m(
        "celery",
        "-A",
        "benchmarks.projects.celery_app",
        "worker",
        "--pool",
        "threads",
        "--concurrency",
        str(concurrency),
        "--loglevel",
        "WARNING",
        "--queues",
        "celery",
    )


def _connect(hit: Callable[[], None]) -> None:
    from celery.signals import task_postrun

    def receiver(**kwargs: object) -> None:
        hit()

    task_postrun.connect(receiver, weak=False)


CELERY = System(
    name="celery",
    label="Celery (threads, Redis)",
    package="celery",
    enqueue_kind="celery",
    async_sleep=False,
    services=("redis",),
    worker_argv=_worker,
    django_settings=_settings,
    connect_completion=_connect,
    redis_db=REDIS_DB,
)
