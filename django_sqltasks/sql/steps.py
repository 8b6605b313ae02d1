"""Statements on the step table of durable tasks: a step's record written as the step returns
(``store/steps.py``), one INSERT without the ORM's per-field work, which was most of a step's
cost to the worker."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db.backends.utils import CursorWrapper

from ..core.serialization import dumps
from .vendor import Vendor

# The columns insert_step writes, in order.
STEP_COLUMNS = (
    "task_id",
    "kind",
    "name",
    "occurrence",
    "state",
    "attempts",
    "result",
    "error",
    "event_key",
    "wake_at",
    "started_at",
    "finished_at",
)


class StepStatements(Vendor):
    """Writing the records of a durable task's steps."""

    steps = ""  # the quoted name of the step table (set by the Dialect)

    def insert_step(
        self,
        cursor: CursorWrapper,
        *,
        task_id: uuid.UUID,
        kind: str,
        name: str,
        occurrence: int,
        state: str,
        attempts: int,
        result: Any,
        error: str,
        event_key: str | None,
        wake_at: datetime | None,
        started_at: datetime,
        finished_at: datetime | None,
    ) -> None:
        """Insert one step's record (checked, normalized JSON ``result``; None for SQL NULL);
        raise ``IntegrityError`` if the task has one of that kind, name and occurrence."""
        values = ", ".join(
            self._json_placeholder if column == "result" else "%s" for column in STEP_COLUMNS
        )
        cursor.execute(
            f"INSERT INTO {self.steps} ({', '.join(STEP_COLUMNS)}) VALUES ({values})",
            [
                self._encode_id(task_id),
                kind,
                name,
                occurrence,
                state,
                attempts,
                None if result is None else dumps(result),
                error,
                event_key,
                self._encode_datetime(wake_at),
                self._encode_datetime(started_at),
                self._encode_datetime(finished_at),
            ],
        )
