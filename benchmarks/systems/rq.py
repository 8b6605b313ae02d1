"""RQ through django-tasks-rq and django-rq; its worker runs one job at a time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.systems.base import Endpoints, System, common_settings, python_m

REDIS_DB = 3
# django-vtasks' published comparison runs RQ on 500 tasks; so do we.
RQ_TASKS = 500


def _settings(endpoints: Endpoints) -> dict[str, Any]:
    settings = common_settings(endpoints)
    settings["INSTALLED_APPS"] = ["django_rq", "benchmarks.projects"]
    settings["TASKS"] = {"default": {"BACKEND": "django_tasks_rq.RQBackend", "QUEUES": ["default"]}}
    settings["RQ_QUEUES"] = {
        "default": {
            "HOST": endpoints.host("redis"),
            "PORT": endpoints.port("redis"),
            "DB": REDIS_DB,
        }
    }
    return settings


def _worker(concurrency: int) -> list[str]:
    # rqworker installs its own log handlers; -v 0 is how it is told to log at WARNING.
    return python_m(
        "django", "rqworker", "--job-class", "django_tasks_rq.Job", "--verbosity", "0", "default"
    )


def _connect(hit: Callable[[], None]) -> None:
    # django-tasks-rq builds on the django-tasks backport, so its signal lives there.
    from django_tasks.signals import task_finished

    def receiver(sender: object, **kwargs: object) -> None:
        hit()

    task_finished.connect(receiver, weak=False, dispatch_uid="bench-completion")


RQ = System(
    name="rq",
    label="RQ (django-tasks-rq)",
    package="django-tasks-rq",
    enqueue_kind="django-tasks",
    async_sleep=False,
    services=("redis",),
    worker_argv=_worker,
    django_settings=_settings,
    connect_completion=_connect,
    effective_concurrency=lambda c: 1,
    max_tasks=RQ_TASKS,
    redis_db=REDIS_DB,
)
