"""The three benchmark tasks, declared with the decorator of the system under test.

``noop`` is a plain ``def`` for every system. ``sleep`` sleeps 10 ms: ``async def`` with
``asyncio.sleep`` where the system runs async tasks natively, ``time.sleep`` otherwise.
``probe`` reports its own start to the latency agent. ``touch`` is the ``mixed`` profile's task
(benchmarks/mixed/): one small write to the app's table, then its report.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from benchmarks.marker import hit, send_probe
from benchmarks.mixed import app
from benchmarks.systems import current_system

SLEEP_SECONDS = 0.010

_SYSTEM = current_system()


def _decorator() -> Callable[[Callable[..., Any]], Any]:
    if _SYSTEM.enqueue_kind == "celery":
        # Importing the app first binds the tasks to it (and its Redis broker), as Celery's
        # Django guide does by importing the app in the project package.
        from benchmarks.projects.celery_app import app

        return app.task  # type: ignore[no-any-return]
    if _SYSTEM.name == "rq":
        from django_tasks import task as backport_task

        return backport_task  # type: ignore[no-any-return]
    if _SYSTEM.package == "django-vtasks":
        from django_vtasks import task as vtasks_task

        return vtasks_task  # type: ignore[no-any-return]
    from django.tasks import task as django_task

    return django_task  # type: ignore[no-any-return]


_task = _decorator()


# Each task counts its own completion as its last statement (``hit``, a no-op unless the
# "body" counting method is on): the same for every system, with no signal receiver anywhere.


@_task
def noop() -> None:
    hit()


if _SYSTEM.async_sleep:

    @_task
    async def sleep() -> None:
        await asyncio.sleep(SLEEP_SECONDS)
        hit()

else:

    @_task
    def sleep() -> None:
        time.sleep(SLEEP_SECONDS)
        hit()


@_task
def probe(seq: int, enqueued_at: float, port: int) -> None:
    send_probe(port, seq, enqueued_at)


@_task
def touch(seq: int, enqueued_at: float, port: int, account: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        raw = app.server_bound(cursor.cursor)
        if raw is None:
            app.run_task(cursor, seq, enqueued_at, port, account)
            return
        with raw:
            app.run_task(raw, seq, enqueued_at, port, account)


TASKS: dict[str, Any] = {"noop": noop, "sleep": sleep, "probe": probe}
