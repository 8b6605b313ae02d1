"""Every raw SQL statement, as one Dialect per database (postgresql.py, mysql.py, sqlite.py).

A Dialect (dialect.py) is made of the statements of each table: tasks.py (inserts, one task),
claims.py (the claim), suspects.py, limit_keys.py, outcomes.py (completions, requeues) and
workers.py, on top of vendor.py (the database's facts and clock) and values.py (values in and
out); health.py reads the task table's upkeep, and rows.py holds the rows they pass. The claim,
the batched completion and the rescue are single statements (or one short transaction on MySQL)
that the ORM cannot express; everything else goes through the QuerySet. Every statement, as each
database receives it, is in the repository's sql/snapshots/ (make sql-snapshots;
CONTRIBUTING.md, "Adding a SQL statement").
"""

from __future__ import annotations

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import load_backend

from .dialect import Dialect
from .mysql import MySQLDialect
from .postgresql import PostgreSQLDialect
from .rows import (
    ANY_LIMIT,
    UNLIMITED,
    ClaimedRow,
    NewTask,
    Outcome,
    Scope,
    SuspectRow,
    TableHealth,
)
from .sqlite import SQLiteDialect

DIALECTS: dict[str, type[Dialect]] = {
    "postgresql": PostgreSQLDialect,
    "sqlite": SQLiteDialect,
    "mysql": MySQLDialect,
}

_dialects: dict[tuple[str, str], Dialect] = {}


def dialect_for(connection: BaseDatabaseWrapper) -> Dialect:
    """Return the SQL dialect for ``connection``'s database, made once per alias."""
    key = (connection.alias, connection.vendor)
    dialect = _dialects.get(key)
    if dialect is None:
        dialect = _dialects[key] = _make_dialect(connection)
    return dialect


def postgresql_dialect(connection: BaseDatabaseWrapper) -> PostgreSQLDialect:
    """The dialect of ``connection``, for what only PostgreSQL does (the claim on the event
    loop's connection, LISTEN); a clear error for another database."""
    dialect = dialect_for(connection)
    if not isinstance(dialect, PostgreSQLDialect):
        raise TypeError(
            f"Database {connection.alias!r} is {connection.display_name}, not PostgreSQL."
        )
    return dialect


def _make_dialect(connection: BaseDatabaseWrapper) -> Dialect:
    dialect = DIALECTS.get(connection.vendor)
    if dialect is None:
        raise NotImplementedError(
            "django-sqltasks supports PostgreSQL, SQLite and MySQL/MariaDB, "
            f"not {connection.vendor!r}."
        )
    return dialect(connection)


def names_missing_table(error: BaseException) -> bool:
    """Whether ``error``, from any supported database, says a table or column is missing."""
    return any(dialect.names_missing_table(error) for dialect in DIALECTS.values())


def engine_vendor(engine: str) -> str:
    """The vendor of a DATABASES ENGINE (``postgresql`` for PostGIS too), read from its class:
    no connection is made. Raise ImproperlyConfigured if the engine does not load."""
    return str(load_backend(engine).DatabaseWrapper.vendor)


def unsupported_version(alias: str) -> str | None:
    """Say which version is needed if ``alias`` runs a server too old for django-sqltasks, or
    a database it does not support at all."""
    connection = connections[alias]
    if connection.vendor not in DIALECTS:
        return (
            f"Database {alias!r} is {connection.display_name}; django-sqltasks needs PostgreSQL, "
            "SQLite, MariaDB or MySQL."
        )
    return dialect_for(connection).version_problem()


__all__ = [
    "ANY_LIMIT",
    "UNLIMITED",
    "ClaimedRow",
    "Dialect",
    "NewTask",
    "Outcome",
    "Scope",
    "SuspectRow",
    "TableHealth",
    "dialect_for",
    "engine_vendor",
    "names_missing_table",
    "postgresql_dialect",
    "unsupported_version",
]
