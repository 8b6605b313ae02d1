"""The expressions the admin's search filters on, on PostgreSQL: the same ones the search
indexes are built on (``indexes.py``), so that the planner matches each filter to its index."""

from __future__ import annotations

from django.db.models import F, Func, JSONField

from ..indexes import ARGUMENT_SCALARS_PATH, ERROR_CLASSES_PATH


class ArgumentValues(Func):
    """Every scalar of a task's args and kwargs, at any depth, as one JSON array
    (``sqltasks_argument_values_idx``)."""

    template = f"jsonb_path_query_array(%(expressions)s, '{ARGUMENT_SCALARS_PATH}')"
    arg_joiner = " || "
    output_field = JSONField()

    def __init__(self) -> None:
        super().__init__(F("args"), F("kwargs"))


class ErrorClasses(Func):
    """The exception class paths of a task's errors, as one JSON array
    (``sqltasks_error_classes_idx``, of FAILED tasks)."""

    template = f"jsonb_path_query_array(%(expressions)s, '{ERROR_CLASSES_PATH}')"
    output_field = JSONField()

    def __init__(self) -> None:
        super().__init__(F("errors"))
