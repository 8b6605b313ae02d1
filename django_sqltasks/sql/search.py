"""The expressions the admin's search filters on, on PostgreSQL: the same ones the search
indexes are built on (``indexes.py``), so that the planner matches each filter to its index."""

from __future__ import annotations

from django.db.models import CharField, F, Func, JSONField

from ..indexes import ARGUMENT_SCALARS_PATH, CLASS_NAME_PATTERN


class ArgumentValues(Func):
    """Every scalar of a task's args and kwargs, at any depth, as one JSON array
    (``sqltasks_argument_values_idx``)."""

    template = f"jsonb_path_query_array(%(expressions)s, '{ARGUMENT_SCALARS_PATH}')"
    arg_joiner = " || "
    output_field = JSONField()

    def __init__(self) -> None:
        super().__init__(F("args"), F("kwargs"))


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
