"""The bare-SQL hand-over row: a task handed by its enqueue to an idle worker, PostgreSQL only."""

from __future__ import annotations

from dataclasses import replace

from benchmarks.systems.base import python_m
from benchmarks.systems.sql_floor import SQL_FLOOR

# The floor's row but for its module: the same probes, one round trip fewer when the worker waits.
SQL_HANDOFF = replace(
    SQL_FLOOR,
    name="sql-handoff",
    label="bare-SQL hand-over (psycopg, PostgreSQL, an idle worker's offer taken by the enqueue)",
    worker_argv=lambda concurrency: python_m("benchmarks.handoff", "worker"),
    sql_module="benchmarks.handoff",
)
