"""Registry of the systems under test, in the order the report shows them."""

from __future__ import annotations

import os

from benchmarks.systems.base import System
from benchmarks.systems.celery import CELERY
from benchmarks.systems.raw_sql import RAW_SQL
from benchmarks.systems.rq import RQ
from benchmarks.systems.sql_floor import SQL_FLOOR
from benchmarks.systems.sql_handoff import SQL_HANDOFF
from benchmarks.systems.sqltasks import SQLTASKS_MARIADB, SQLTASKS_PG, SQLTASKS_SQLITE
from benchmarks.systems.tasks_db import TASKS_DB
from benchmarks.systems.vtasks import VTASKS_DB, VTASKS_VALKEY

SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        SQLTASKS_PG,
        SQLTASKS_SQLITE,
        SQLTASKS_MARIADB,
        VTASKS_VALKEY,
        VTASKS_DB,
        CELERY,
        RQ,
        TASKS_DB,
        RAW_SQL,
        SQL_FLOOR,
        SQL_HANDOFF,
    )
}
SMOKE_SYSTEMS = ("sqltasks-pg", "sqltasks-sqlite", "tasks-db", "sql-floor", "sql-handoff")


def current_system() -> System:
    """Return the system named by ``BENCH_SYSTEM`` (set for every subprocess)."""
    name = os.environ["BENCH_SYSTEM"]
    try:
        return SYSTEMS[name]
    except KeyError as e:
        raise ValueError(f"BENCH_SYSTEM must be one of {', '.join(SYSTEMS)}, not {name!r}") from e
