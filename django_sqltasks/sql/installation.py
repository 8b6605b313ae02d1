"""What a project that skipped a setup step is told, in the same words wherever it shows."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DatabaseError, connections

from . import dialect_for, names_missing_table

APP = "django_sqltasks"


def not_installed(alias: str) -> str:
    return (
        f"TASKS[{alias!r}] uses django_sqltasks.SQLTaskBackend, but the django_sqltasks app is "
        "not installed: add 'django_sqltasks' to INSTALLED_APPS, then run 'manage.py migrate'."
    )


def unreachable(alias: str, error: BaseException) -> str:
    """Say in one line which database could not be reached, where, and why."""
    connection = connections[alias]
    where = dialect_for(connection).location()
    reason = " ".join(str(error).split())  # drivers' messages span lines; a log line must not
    return f"Cannot connect to database {alias!r} ({connection.vendor} at {where}): {reason}"


def not_migrated(database: str, unapplied: list[str] | None = None) -> str:
    detail = f" (not applied: {', '.join(unapplied)})" if unapplied else ""
    return (
        f"The django_sqltasks tables in database {database!r} are missing or out of date"
        f"{detail}: run 'manage.py migrate'."
    )


def is_missing_table(error: BaseException) -> bool:
    """Whether ``error`` says a table or column of this app does not exist."""
    message = str(error)
    # MySQL names no table for a missing column; every other message names ours.
    return names_missing_table(error) and (APP in message or "Unknown column" in message)


def unapplied_migrations(database: str) -> list[str]:
    """The names of this app's migrations not applied to ``database``."""
    # Measured start-up cost: 6 ms to import, paid only by the checks that need it.
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connections[database], ignore_no_migrations=True)
    applied = loader.applied_migrations or {}
    return sorted(
        name for app, name in loader.graph.nodes if app == APP and (app, name) not in applied
    )


@contextmanager
def explain_missing_tables(database: str) -> Iterator[None]:
    """Re-raise a "no such table" error from this app's tables as the same class of error,
    saying to run migrate (the driver's message, chained, stays below it)."""
    try:
        yield
    except DatabaseError as e:
        if is_missing_table(e):
            raise type(e)(not_migrated(database)) from e
        raise


def running_migrate() -> bool:
    """Whether this process is ``manage.py migrate``, which runs the database checks before it
    applies anything: a "run migrate" warning there would tell the user to do what they do."""
    return sys.argv[1:2] == ["migrate"]
