"""Every raw SQL statement on the task table, one module per database.

The claim, the batched completion and the rescue are single statements (or one short
transaction on MySQL) that the ORM cannot express; everything else goes through the QuerySet.
"""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper

from .dialect import ANY_LIMIT, UNLIMITED, ClaimedRow, Dialect, NewTask, Outcome, Scope, TableHealth

_dialects: dict[tuple[str, str], Dialect] = {}


def dialect_for(connection: BaseDatabaseWrapper) -> Dialect:
    """Return the SQL dialect for ``connection``'s database, made once per alias."""
    key = (connection.alias, connection.vendor)
    dialect = _dialects.get(key)
    if dialect is None:
        dialect = _dialects[key] = _make_dialect(connection)
    return dialect


def _make_dialect(connection: BaseDatabaseWrapper) -> Dialect:
    vendor = connection.vendor
    if vendor == "postgresql":
        from .postgresql import PostgreSQLDialect

        return PostgreSQLDialect(connection)
    if vendor == "sqlite":
        from .sqlite import SQLiteDialect

        return SQLiteDialect(connection)
    if vendor == "mysql":
        from .mysql import MySQLDialect

        return MySQLDialect(connection)
    raise NotImplementedError(
        f"django-sqltasks supports PostgreSQL, SQLite and MySQL/MariaDB, not {vendor!r}."
    )


def names_missing_table(error: BaseException) -> bool:
    """Whether ``error``, from any supported database, says a table or column is missing."""
    from .mysql import MySQLDialect
    from .postgresql import PostgreSQLDialect
    from .sqlite import SQLiteDialect

    return any(
        dialect.names_missing_table(error)
        for dialect in (PostgreSQLDialect, MySQLDialect, SQLiteDialect)
    )


def unsupported_version(alias: str) -> str | None:
    """Say which version is needed if ``alias`` runs a server too old for django-sqltasks, or
    a database it does not support at all."""
    from django.db import connections

    connection = connections[alias]
    if connection.vendor not in {"postgresql", "sqlite", "mysql"}:
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
    "TableHealth",
    "dialect_for",
    "names_missing_table",
    "unsupported_version",
]
