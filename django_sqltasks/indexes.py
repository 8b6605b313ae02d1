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
