"""Statements on the step table of durable tasks: a step's record written as the step returns
(``store/steps.py``), one INSERT without the ORM's per-field work, which was most of a step's
cost to the worker; and, where the database can say it in one statement, a task's first wait
for an event parked at once (``store/waits.py``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class ParkedWait:
    """A wait's record as ``park_at_event`` wrote it: the task is READY until ``until``."""

    step_id: int
    started_at: datetime
    wake_at: datetime | None  # None: no timeout (then ``until`` is PARKED)
    until: datetime


class StepStatements(Vendor):
    """Writing the records of a durable task's steps."""

    steps = ""  # the quoted name of the step table (set by the Dialect)
    events = ""  # the quoted name of the event table (set by the Dialect)
    # Whether park_at_event parks a wait in one statement (PostgreSQL: a data-modifying WITH).
    parks_in_one_statement = False

    def park_at_event(
        self,
        cursor: CursorWrapper,
        *,
        task_id: uuid.UUID,
        owner: str,
        attempt: int,
        claims: int,
        name: str,
        key: str,
        occurrence: int,
        timeout: float | None,
    ) -> ParkedWait | None:
        """Where ``parks_in_one_statement``: in one statement, take the row of event (name,
        key) as this task's (made if it has none yet), and, if the event is not sent and no
        other task waits for it, put the task back to READY until the wait's timeout (by the
        database's clock; PARKED without one), its attempt given back, and write the wait's
        record, all if the task is still held under this claim (RUNNING, by ``owner``, at
        ``attempt``, claimed ``claims`` times). The record written; None if it parked nothing
        (the event was sent, another task waits for it, or the claim is gone), and then the
        event's row is as the wait's first statement leaves it in the general way: its
        waiter set if it had none."""
        raise NotImplementedError(f"{self.product} parks a wait in a transaction")

    # Whether mark_event_sent and wake_waiter send an event in two statements (PostgreSQL:
    # UPDATE ... RETURNING); elsewhere ``store/events.py`` takes the ORM's way.
    sends_in_two_statements = False

    def mark_event_sent(
        self, cursor: CursorWrapper, *, name: str, key: str, payload: Any
    ) -> tuple[bool, uuid.UUID | None]:
        """In the caller's transaction, record the payload of event (name, key) and its time
        (the database's) where its row exists unsent; whether it did, and the row's waiter."""
        raise NotImplementedError(f"{self.product} sends an event through the ORM")

    def wake_waiter(
        self, cursor: CursorWrapper, task_id: uuid.UUID, *, notify: bool
    ) -> tuple[str | None, bool]:
        """In the caller's transaction, after mark_event_sent (a statement of its own, so that
        it sees a park that committed while the event's row was locked): make the READY task
        ``task_id`` due now, by the database's clock, if it is not due yet, and with
        ``notify`` wake its queue's workers at commit. The queue it woke (None: none), and
        whether the task is READY or RUNNING."""
        raise NotImplementedError(f"{self.product} sends an event through the ORM")

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
