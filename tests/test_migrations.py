"""One migration, and a fresh ``migrate`` makes exactly what the models declare."""

from __future__ import annotations

from io import StringIO

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from django_sqltasks.store.partitions import partitioned

APP = "django_sqltasks"
pytestmark = pytest.mark.django_db
# Columns a constraint adds for itself: MySQL has no partial unique index, so the live dedupe
# constraint is a unique index on a generated column (indexes.LiveDedupeConstraint).
HELPER_COLUMNS = {"mysql": {"dedupe_live_key"}}


def models() -> list[type]:
    return [m for m in apps.get_app_config(APP).get_models() if not m._meta.proxy]


def names_on(table: str) -> set[str]:
    """The constraint and index names of ``table`` and, on PostgreSQL's partitioned task
    table, of its partitions (some indexes serve the live partition only)."""
    tables = [table]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT relid::text FROM pg_partition_tree(%s::regclass)",
                [connection.ops.quote_name(table)],
            )
            tables = [str(name).strip('"') for (name,) in cursor.fetchall()] or [table]
    names: set[str] = set()
    with connection.cursor() as cursor:
        for name in tables:
            names |= set(connection.introspection.get_constraints(cursor, name))
    return names


def test_the_app_has_one_migration() -> None:
    loader = MigrationLoader(connection)
    assert sorted(name for app, name in loader.disk_migrations if app == APP) == ["0001_initial"]
    out = StringIO()
    call_command("showmigrations", APP, stdout=out)
    assert out.getvalue().split() == [APP, "[X]", "0001_initial"]


def test_migrate_made_every_column_index_and_constraint_the_models_declare() -> None:
    with connection.cursor() as cursor:
        tables = set(connection.introspection.table_names(cursor))
    for model in models():
        table = model._meta.db_table
        assert table in tables, table
        with connection.cursor() as cursor:
            columns = {
                c.name for c in connection.introspection.get_table_description(cursor, table)
            }
        declared = {f.column for f in model._meta.concrete_fields}
        assert columns - HELPER_COLUMNS.get(connection.vendor, set()) == declared, table
        names = names_on(table)
        for index in model._meta.indexes:
            if type(index).__name__ == "PostgreSQLIndex" and connection.vendor != "postgresql":
                continue  # the search indexes exist on PostgreSQL only (docs/admin.md)
            if type(index).__name__ == "FilterIndex" and connection.vendor == "postgresql":
                continue  # the filter indexes exist on MariaDB and SQLite only
            assert index.name in names, f"{table}: {index.name}"
        for constraint in model._meta.constraints:
            if connection.vendor == "mysql" and "CheckConstraint" in type(constraint).__name__:
                continue  # MariaDB names its CHECK constraints itself in some versions
            assert constraint.name in names, f"{table}: {constraint.name}"


def test_no_table_of_the_app_is_left_undeclared() -> None:
    declared = {m._meta.db_table for m in models()}
    with connection.cursor() as cursor:
        ours = {t for t in connection.introspection.table_names(cursor) if t.startswith(APP)}
    task_table = apps.get_model(APP, "TaskRecord")._meta.db_table
    if partitioned("default"):  # the task table's partitions: its live tasks and its days
        ours = {t for t in ours if not t.startswith(task_table + "_")}
    assert ours == declared
