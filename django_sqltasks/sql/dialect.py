"""What every SQL dialect provides: one class made of the statements on each table, which each
database's dialect (postgresql.py, mysql.py, sqlite.py) specializes.

Where each part lives: vendor.py (the facts about the database, its clock) on values.py
(values in and out), tasks.py (inserts and single-task statements), claims.py (the claim and
its conditions), suspects.py (the suspects), limit_keys.py (the keys of limited tasks, the
fair claim's round), probes.py (the health probe's statements, on top of the claim's),
outcomes.py (completions, salvage, requeues), workers.py (the worker table) and steps.py (the
step records of durable tasks); the row types they take and return are in rows.py.
"""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper

from .limit_keys import LimitKeyStatements
from .outcomes import OutcomeStatements
from .probes import ProbeStatements
from .steps import StepStatements
from .suspects import SuspectStatements
from .tasks import TaskStatements
from .workers import WorkerStatements


class Dialect(
    TaskStatements,
    ProbeStatements,
    SuspectStatements,
    LimitKeyStatements,
    OutcomeStatements,
    WorkerStatements,
    StepStatements,
):
    """Raw SQL for one database vendor, run on a Django connection's cursor, and the facts
    about that database that the rest of the package acts on."""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        # The app registry: sql/ loads with the backend, which may be before the models can be
        # imported; a dialect is made at the first statement, after setup.
        from ..models import EventRecord, PausedQueue, StepRecord, TaskRecord, WorkerRecord

        super().__init__(
            connection,
            tasks=TaskRecord._meta.db_table,
            workers=WorkerRecord._meta.db_table,
            paused=PausedQueue._meta.db_table,
        )
        self.steps = connection.ops.quote_name(StepRecord._meta.db_table)
        self.events = connection.ops.quote_name(EventRecord._meta.db_table)
