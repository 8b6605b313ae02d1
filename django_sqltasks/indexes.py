"""An index that is partial where the database allows it, the expressions the search indexes
are built on, and a filter that SQLite matches to a partial index."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from django.db import models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.backends.ddl_references import Statement
from django.db.models import Lookup


class PartialIndex(models.Index):
    """Index ``fields`` of rows matching ``where``; lacking partial indexes, lead with ``fallback``.

    ``where`` is kept out of ``Index.condition`` so that MySQL/MariaDB, which cannot build partial
    indexes, get a full index led by the filtered columns instead of a warning and no index at all.
    """

    def __init__(
        self, *, fields: Sequence[str], name: str, where: models.Q, fallback: Sequence[str]
    ) -> None:
        super().__init__(fields=fields, name=name)
        self.where = where
        self.fallback = list(fallback)

    def _concrete(self, schema_editor: BaseDatabaseSchemaEditor) -> models.Index:
        if schema_editor.connection.features.supports_partial_indexes:
            return models.Index(fields=self.fields, name=self.name, condition=self.where)
        return models.Index(fields=[*self.fallback, *self.fields], name=self.name)

    def create_sql(
        self,
        model: type[models.Model],
        schema_editor: BaseDatabaseSchemaEditor,
        using: str = "",
        **kwargs: Any,
    ) -> Statement:
        return self._concrete(schema_editor).create_sql(model, schema_editor, using, **kwargs)

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        path, args, kwargs = super().deconstruct()
        kwargs["where"] = self.where
        kwargs["fallback"] = self.fallback
        return path, args, kwargs


class LiveDedupeConstraint(models.BaseConstraint):
    """At most one READY or RUNNING task per ``dedupe_key``.

    A partial unique index where the database has them (PostgreSQL, SQLite), so only
    deduplicated live rows are indexed. MySQL and MariaDB have none: there, a stored generated
    column holds the key while the task is live (NULL after), under a unique index.
    """

    field = "dedupe_key"
    live = ("READY", "RUNNING")
    mysql_column = "dedupe_live_key"

    def _partial(self) -> models.UniqueConstraint:
        return models.UniqueConstraint(
            fields=[self.field],
            condition=models.Q(status__in=self.live) & models.Q(dedupe_key__isnull=False),
            name=self.name,
        )

    def _is_mysql(self, schema_editor: BaseDatabaseSchemaEditor | None) -> bool:
        assert schema_editor is not None
        return not schema_editor.connection.features.supports_partial_indexes

    def constraint_sql(
        self, model: type[models.Model] | None, schema_editor: BaseDatabaseSchemaEditor | None
    ) -> Any:
        assert schema_editor is not None
        if self._is_mysql(schema_editor):
            # The generated column is added after the table exists.
            schema_editor.deferred_sql.append(self.create_sql(model, schema_editor))
            return None
        return self._partial().constraint_sql(model, schema_editor)

    def create_sql(
        self, model: type[models.Model] | None, schema_editor: BaseDatabaseSchemaEditor | None
    ) -> Any:
        assert model is not None and schema_editor is not None
        if not self._is_mysql(schema_editor):
            return self._partial().create_sql(model, schema_editor)
        qn = schema_editor.quote_name
        statuses = ", ".join(f"'{status}'" for status in self.live)
        return (
            f"ALTER TABLE {qn(model._meta.db_table)} ADD COLUMN {qn(self.mysql_column)} "
            f"varchar(255) GENERATED ALWAYS AS (CASE WHEN {qn('status')} IN ({statuses}) "
            f"THEN {qn(self.field)} END) STORED, ADD UNIQUE INDEX {qn(self.name)} "
            f"({qn(self.mysql_column)})"
        )

    def remove_sql(
        self, model: type[models.Model] | None, schema_editor: BaseDatabaseSchemaEditor | None
    ) -> Any:
        assert model is not None and schema_editor is not None
        if not self._is_mysql(schema_editor):
            return self._partial().remove_sql(model, schema_editor)
        qn = schema_editor.quote_name
        return (
            f"ALTER TABLE {qn(model._meta.db_table)} DROP INDEX {qn(self.name)}, "
            f"DROP COLUMN {qn(self.mysql_column)}"
        )

    def validate(self, *args: Any, **kwargs: Any) -> None:
        """Enforced by the database at INSERT; enqueue returns the live task instead."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LiveDedupeConstraint) and self.name == other.name

    __hash__ = models.BaseConstraint.__hash__


# What the admin's search looks values up in, as PostgreSQL expressions: every scalar of a
# task's arguments (args and kwargs, at any depth; with its task and queue, below), and the
# name of the class of the last error (the one a FAILED task failed with) without its module,
# so that "PaymentDeclined" finds "shop.errors.PaymentDeclined". The search (sql/search.py)
# filters on the very same expressions, so the planner matches them to these indexes. The
# walk stops 40 levels down: an enqueue refuses arguments nested deeper than 30
# (core/serialization.py, MAX_DEPTH), and an unbounded walk of a row stored deeper by other
# means (12,000 levels) overflows PostgreSQL's stack, failing the row's INSERT or UPDATE.
SEARCH_DEPTH = 40
ARGUMENT_SCALARS_PATH = (
    f'strict $.**{{0 to {SEARCH_DEPTH}}} ? (@.type() != "object" && @.type() != "array")'
)
# After them, one object {"t": task path, "q": queue}: no scalar of the arguments matches an
# object, and the admin's filter by a task or a queue with few rows (a daily job among 50
# million tasks, a queue no task of which ever failed) finds them through this index instead
# of reading every partition (ops/search.py, by_column). jsonb_object(text[]) is immutable, as
# an index expression must be (jsonb_build_object is not); each element is cast to text, so
# that the expression reads back (pg_get_indexdef, as a table's conversion rebuilds its
# indexes) as it was written, and the planner still matches the search's to it.
TASK_KEY, QUEUE_KEY = "t", "q"
ARGUMENT_VALUES_SQL = (
    f"(jsonb_path_query_array(args || kwargs, '{ARGUMENT_SCALARS_PATH}') "
    f"|| jsonb_object(ARRAY['{TASK_KEY}', task_path::text, '{QUEUE_KEY}', queue_name::text]))"
)
LAST_ERROR_CLASS_SQL = "(errors -> -1) ->> 'exception_class_path'"
CLASS_NAME_PATTERN = r"'^.*\.'"  # a dotted path up to its last dot
ERROR_CLASS_NAME_SQL = f"regexp_replace({LAST_ERROR_CLASS_SQL}, {CLASS_NAME_PATTERN}, '')"


# A GIN index gathers new entries in a pending list and merges them into its tree once the
# list holds gin_pending_list_limit (4 MB by default): the statement that passes the limit pays
# for the whole merge. The task table's GIN indexes take an entry at every enqueue, claim and
# finish: at 400 tasks/s a merge came every 30 to 60 s and took one enqueue or claim 80 to 130
# ms (158,000 buffers). The smallest list, 64 kB, merges as often as needed at the same total
# cost (the task's insert, claim and finish, 15,000 times on 4 connections: 3,418 against 3,440
# a second, slowest 16 ms against 82 ms); writing each entry at once (fastupdate = off) costs
# 5% more throughput.
GIN_STORAGE = "gin_pending_list_limit = 64"


class PostgreSQLIndex(models.Index):
    """An index (GIN with ``jsonb_path_ops``, or ``using="btree"``) on the expression
    ``expression`` of rows matching ``where``, on PostgreSQL; no index elsewhere.

    MariaDB and SQLite have no index that finds a value inside a JSON document, so there the
    admin's search reads a bounded window of the newest tasks instead (docs/admin.md).
    """

    def __init__(self, *, name: str, expression: str, where: str = "", using: str = "gin") -> None:
        super().__init__(fields=["id"], name=name)  # fields: Django's checks want some
        self.expression = expression
        self.where = where
        self.using = using

    def _applies(self, schema_editor: BaseDatabaseSchemaEditor) -> bool:
        return schema_editor.connection.vendor == "postgresql"

    def create_sql(
        self,
        model: type[models.Model],
        schema_editor: BaseDatabaseSchemaEditor,
        using: str = "",
        **kwargs: Any,
    ) -> Any:
        if not self._applies(schema_editor):
            return NO_STATEMENT
        qn = schema_editor.quote_name
        where = f" WHERE {self.where}" if self.where else ""
        opclass = " jsonb_path_ops" if self.using == "gin" else ""
        storage = f" WITH ({GIN_STORAGE})" if self.using == "gin" else ""
        return (
            # IF NOT EXISTS: an index built beforehand (CONCURRENTLY, on a busy table) is kept.
            f"CREATE INDEX IF NOT EXISTS {qn(self.name)} ON {qn(model._meta.db_table)} "
            f"USING {self.using} "
            f"(({self.expression}){opclass}){storage}{where}"
        )

    def remove_sql(
        self, model: type[models.Model], schema_editor: BaseDatabaseSchemaEditor, **kwargs: Any
    ) -> Any:
        if not self._applies(schema_editor):
            return NO_STATEMENT
        return f"DROP INDEX IF EXISTS {schema_editor.quote_name(self.name)}"

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        path, _, _ = super().deconstruct()
        kwargs = {"name": self.name, "expression": self.expression, "where": self.where}
        if self.using != "gin":
            kwargs["using"] = self.using
        return path, (), kwargs


class FilterIndex(models.Index):
    """An index on ``fields`` on MariaDB and SQLite only: the admin's filter by a task or a
    queue reads it, newest first (``(task_path, id)``), where PostgreSQL reads the argument
    index's entry for them instead (``ARGUMENT_VALUES_SQL``).

    There it costs an entry at enqueue and at pruning only: InnoDB and SQLite rewrite a
    secondary index when one of its columns changes, and a task's path and queue never do,
    where PostgreSQL writes every index at each status change (no update of the task table is
    HOT)."""

    def create_sql(
        self,
        model: type[models.Model],
        schema_editor: BaseDatabaseSchemaEditor,
        using: str = "",
        **kwargs: Any,
    ) -> Any:
        if schema_editor.connection.vendor == "postgresql":
            return NO_STATEMENT
        return super().create_sql(model, schema_editor, using=using, **kwargs)

    def remove_sql(
        self, model: type[models.Model], schema_editor: BaseDatabaseSchemaEditor, **kwargs: Any
    ) -> Any:
        if schema_editor.connection.vendor == "postgresql":
            return NO_STATEMENT
        return super().remove_sql(model, schema_editor, **kwargs)


# Django's schema editor runs whatever create_sql returns: where an index does not apply, a
# statement that does nothing on MariaDB and SQLite alike.
NO_STATEMENT = "SELECT 1"


CONSTANT = re.compile(r"[A-Z_]+")  # the values InConstants writes into SQL: status names


class InConstants(Lookup):
    """``field IN ('A', 'B')``, its values written into the SQL rather than passed as
    parameters: SQLite uses a partial index whose predicate is such an IN list (the finished
    index, ``status IN ('SUCCESSFUL', 'FAILED')``) only when the query's list is made of
    literals; with ``IN (?, ?)`` it reads the whole table. The values are this package's
    constants (status names), never input. A lookup, so that ``filter()`` takes it as the
    condition itself (an expression would become ``(...) = true``, which no index matches)."""

    lookup_name = "in_constants"
    prepare_rhs = False

    def __init__(self, field: str, values: Sequence[str]) -> None:
        if not values or not all(CONSTANT.fullmatch(value) for value in values):
            raise ValueError(f"InConstants: values must be status names, got {values!r}")
        super().__init__(models.F(field), tuple(values))

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, Any]:
        sql, params = compiler.compile(self.lhs)
        literals = ", ".join(f"'{value}'" for value in self.rhs)
        return f"{sql} IN ({literals})", params
