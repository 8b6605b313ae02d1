"""The "raw SQL limit" row: batch enqueue and batch claim/complete with plain psycopg."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.systems.base import Endpoints, System, python_m


def _no_settings(endpoints: Endpoints) -> dict[str, Any]:
    return {}


def _worker(concurrency: int) -> list[str]:
    return python_m("benchmarks.rawsql", "worker", "--concurrency", str(concurrency))


def _connect(hit: Callable[[], None]) -> None:
    raise NotImplementedError("the raw SQL worker counts completions itself")


RAW_SQL = System(
    name="raw-sql",
    label="raw SQL limit (psycopg, PostgreSQL)",
    package="psycopg",
    enqueue_kind="raw-sql",
    async_sleep=True,
    services=("postgresql",),
    worker_argv=_worker,
    django_settings=_no_settings,
    connect_completion=_connect,
    supports_http=False,
)
