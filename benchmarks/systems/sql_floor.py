"""The bare-SQL floor row: INSERT + NOTIFY, LISTEN + claim, on a minimal PostgreSQL table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.systems.base import Endpoints, System, python_m


def _no_settings(endpoints: Endpoints) -> dict[str, Any]:
    return {}


def _worker(concurrency: int) -> list[str]:
    # One task at a time, whatever the concurrency: the floor of one task's latency.
    return python_m("benchmarks.floor", "worker")


def _connect(hit: Callable[[], None]) -> None:
    raise NotImplementedError("the floor runs the latency probes only")


SQL_FLOOR = System(
    name="sql-floor",
    label="bare-SQL floor (psycopg, PostgreSQL, minimal table, NOTIFY)",
    package="psycopg",
    enqueue_kind="sql-floor",
    async_sleep=False,
    services=("postgresql",),
    worker_argv=_worker,
    django_settings=_no_settings,
    connect_completion=_connect,
    effective_concurrency=lambda c: 1,
    supports_http=False,
    only_scenarios=("latency", "busy"),
)
