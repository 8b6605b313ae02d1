"""The expressions the admin's search filters on, on PostgreSQL: the same ones the search
indexes are built on (``indexes.py``), so that the planner matches each filter to its index."""

from __future__ import annotations

from typing import Any

from django.db.models import CharField, F, Func, JSONField

from ..indexes import ARGUMENT_SCALARS_PATH, CLASS_NAME_PATTERN, QUEUE_KEY, TASK_KEY


class ArgumentValues(Func):
    """Every scalar of a task's args and kwargs, at any depth, then ``{"t": its task path,
    "q": its queue}``, as one JSON array (``sqltasks_argument_values_idx``)."""

    output_field = JSONField()

    def __init__(self) -> None:
        super().__init__(F("args"), F("kwargs"), F("task_path"), F("queue_name"))

    def as_sql(  # type: ignore[override]  # one fixed template: no function or joiner to pass
        self, compiler: Any, connection: Any, **extra: Any
    ) -> tuple[str, list[Any]]:
        parts, params = [], []
        for expression in self.get_source_expressions():
            sql, more = compiler.compile(expression)
            parts.append(sql)
            params.extend(more)
        args, kwargs, path, queue = parts
        return (
            f"(jsonb_path_query_array({args} || {kwargs}, '{ARGUMENT_SCALARS_PATH}') "
            f"|| jsonb_object(ARRAY['{TASK_KEY}', {path}::text, '{QUEUE_KEY}', {queue}::text]))",
            params,
        )


class LastErrorClass(Func):
    """The class path of a task's last error (the one a FAILED task failed with)."""

    template = "(%(expressions)s -> -1) ->> 'exception_class_path'"
    output_field = CharField()

    def __init__(self) -> None:
        super().__init__(F("errors"))


class ErrorClassName(Func):
    """The class name of a task's last error, without its module (``sqltasks_error_class_idx``,
    of FAILED tasks)."""

    template = f"regexp_replace(%(expressions)s, {CLASS_NAME_PATTERN}, '')"
    output_field = CharField()

    def __init__(self) -> None:
        super().__init__(LastErrorClass())
