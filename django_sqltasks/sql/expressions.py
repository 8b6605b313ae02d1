"""ORM expressions whose SQL differs by database: used in QuerySet updates that change many rows
in one statement."""

from __future__ import annotations

from typing import Any

import orjson
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import BooleanField, Expression, F, Func, IntegerField, JSONField, Value
from django.db.models.sql.compiler import SQLCompiler


class AppendError(Func):
    """The ``errors`` JSON array of each row with ``entry`` added at its end: one UPDATE for a
    batch of rows, whatever errors each already holds."""

    output_field = JSONField()

    def __init__(self, entry: dict[str, Any]) -> None:
        self.entry = entry
        super().__init__(F("errors"), Value(orjson.dumps([entry]).decode()))

    def as_postgresql(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any
    ) -> Any:
        return self.as_sql(
            compiler, connection, template="(%(expressions)s::jsonb)", arg_joiner=" || "
        )

    def as_mysql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any) -> Any:
        # Two arrays merge into one with the second's items after the first's.
        return self.as_sql(compiler, connection, function="JSON_MERGE_PRESERVE")

    def as_sqlite(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any
    ) -> Any:
        column, _ = self.get_source_expressions()
        item: Expression = Value(orjson.dumps(self.entry).decode())
        sql_column, column_params = compiler.compile(column)
        sql_item, item_params = compiler.compile(item)
        return (
            f"json_insert({sql_column}, '$[#]', json({sql_item}))",
            [*column_params, *item_params],
        )


class HasTag(Func):
    """Whether a task's ``tags`` list holds ``tag`` (exactly: case and all). On PostgreSQL a
    containment the tag index (``sqltasks_tags_idx``) serves; elsewhere a scan."""

    output_field = BooleanField()

    def __init__(self, tag: str) -> None:
        super().__init__(F("tags"), Value(orjson.dumps([tag]).decode()))
        self.tag = tag

    def as_postgresql(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any
    ) -> Any:
        return self.as_sql(
            compiler, connection, template="(%(expressions)s::jsonb)", arg_joiner=" @> "
        )

    def as_mysql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any) -> Any:
        return self.as_sql(
            compiler, connection, template="COALESCE(JSON_CONTAINS(%(expressions)s), 0) = 1"
        )

    def as_sqlite(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any
    ) -> Any:
        column, _ = self.get_source_expressions()
        sql_column, params = compiler.compile(column)
        return (
            f"EXISTS (SELECT 1 FROM json_each({sql_column}) WHERE json_each.value = %s)",
            [*params, self.tag],
        )


class Claims(Func):
    """How many times a task was claimed: the length of its ``worker_ids`` list, to which each
    claim adds its worker. A sleep's park gives its attempt back, so the next claim has the
    same attempt number; only this count tells that claim from the one before."""

    output_field = IntegerField()

    def __init__(self) -> None:
        super().__init__(F("worker_ids"))

    def as_postgresql(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any
    ) -> Any:
        return self.as_sql(compiler, connection, function="jsonb_array_length")

    def as_mysql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, function="JSON_LENGTH")

    def as_sqlite(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any
    ) -> Any:
        return self.as_sql(compiler, connection, function="json_array_length")
