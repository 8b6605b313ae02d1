"""Reading a task's result from its row."""

from __future__ import annotations

import uuid
from typing import Any

from ..compat import TaskResult, TaskResultDoesNotExist
from ..models import TaskRecord
from ..task import CUT_MARKER, result_from_row
from .partitions import partitioned_recently


def get_result(database: str, alias: str, result_id: str) -> TaskResult:
    """The current state of task ``result_id`` of backend ``alias``; raise
    ``TaskResultDoesNotExist`` for an unknown id."""
    try:
        task_uuid = uuid.UUID(str(result_id))
    except ValueError as e:
        raise TaskResultDoesNotExist(result_id) from e
    records = (
        TaskRecord.objects.using(database)
        .with_id(task_uuid, partitioned=partitioned_recently(database))
        .filter(backend_name=alias)
    )
    try:
        record: TaskRecord = records.get()
    except TaskRecord.DoesNotExist as e:
        raise TaskResultDoesNotExist(result_id) from e
    except RecursionError:
        # JSON nested deeper than Python's decoder goes (only PostgreSQL stores it).
        return result_from_row(undecodable_row(records))
    return record.task_result


def undecodable_row(records: Any) -> dict[str, Any]:
    """Read the one row of ``records`` column by column, putting CUT_MARKER (in a list, or a
    dict, as the column holds) for each JSON column Python cannot decode without recursing
    too deep."""
    fields = {f.attname: f for f in TaskRecord._meta.concrete_fields}
    json_columns = {
        "args": [CUT_MARKER],
        "kwargs": {"cut": CUT_MARKER},
        "return_value": CUT_MARKER,
        "errors": [CUT_MARKER],
    }
    row: dict[str, Any] = records.values(*(n for n in fields if n not in json_columns)).get()
    for name, stand_in in json_columns.items():
        try:
            row[name] = records.values_list(name, flat=True).get()
        except RecursionError:
            row[name] = stand_in
    return row
