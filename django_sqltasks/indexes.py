"""An index that is partial where the database allows it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.backends.ddl_references import Statement


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
