"""The steps of one attempt of a durable task, recorded as they return (see docs/durable.md),
and the deletion of a deleted task's steps.

A run of the task replays its code from the top; each ``step``, ``sleep`` and
``wait_for_event`` call is numbered by its name (its occurrence), and finds the record an
earlier run left for that number: a finished step returns its stored result without running.
The records of the task are read once, at the first call. Sleeps and waits are
``store/waits.py``.

Every call the task's thread makes to the database here rides out a lost connection (a
restart, a failover) and contention, on a new connection, for up to RETRY_SECONDS
(``sql/retries.py``). A try whose connection was lost may have committed: the next try reads
the records again, and each write is one that a second try finds done (a step's record is
unique per task, kind, name and occurrence; a park is guarded by the claim it ends).
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from inspect import isawaitable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import IntegrityError, connections, transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from ..core.backends import sql_backend
from ..core.durable import MAX_STEPS_PER_TASK, step_key
from ..core.serialization import check_json, dumps, normalized
from ..core.storable import storable_class_path, storable_traceback
from ..exceptions import (
    InvalidStep,
    InvalidTaskArguments,
    PayloadTooLarge,
    Suspended,
)
from ..models import EventRecord, StepRecord, TaskRecord
from ..sql import dialect_for
from ..sql.retries import run_with_retries
from ..sql.steps import STEP_COLUMNS
from . import new_workflows

logger = logging.getLogger("django_sqltasks")

Key = tuple[str, str, int]  # (kind, name, occurrence)
T = TypeVar("T")

# Seconds a durable call tries again after a lost connection or contention, before it raises
# (into the task, whose retry policy decides): a restart takes seconds, a managed database's
# failover a minute or two.
RETRY_SECONDS = 120.0

STEP, SLEEP, EVENT = StepRecord.STEP, StepRecord.SLEEP, StepRecord.EVENT
DONE, FAILED = StepRecord.DONE, StepRecord.FAILED
WAITING, TIMED_OUT = StepRecord.WAITING, StepRecord.TIMED_OUT


class StepRecords:
    """The records of one attempt's steps, and its steps (``AttemptSteps``, in
    ``store/waits.py``, adds its sleeps and waits)."""

    def __init__(
        self, *, task_id: uuid.UUID, owner: str, attempt: int, claims: int, backend_name: str
    ) -> None:
        backend = sql_backend(backend_name)
        self.backend = backend
        self.task_id = task_id
        # The claim this attempt runs under, which a park is guarded by: the worker holding
        # the task, its attempt number, and how many times the task was claimed (its
        # worker_ids), which is what tells a claim after a park from the one before.
        self.owner = owner
        self.attempt = attempt
        self.claims = claims
        self.database = backend.database
        self.max_bytes = backend.config.max_payload_bytes
        # Transactions already open when the task started (a test's): a sleep may not be
        # inside one more (an atomic=True task's, or the task's own transaction.atomic()).
        self.depth = len(connections[self.database].atomic_blocks)
        # Read at the first durable call, but at the task's first claim ever: only a run
        # writes records, and every run follows a claim (each adds to worker_ids; a retry
        # keeps them), so there are none to read. Were one there all the same (a row whose
        # worker ids were rewritten), the step would run again and its INSERT find the
        # record (a duplicate): the result stored first stands, as for two runs at once.
        self._records: dict[Key, StepRecord] | None = {} if claims == 1 else None
        self._seen: dict[tuple[str, str], int] = {}
        self._calls = 0
        self._suspended: Suspended | None = None

    # Steps ---------------------------------------------------------------------------------

    def next_key(self, name: str) -> str:
        return step_key(str(self.task_id), name, self._seen.get((STEP, name), 0))

    def step(self, name: str, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        occurrence = self._next(STEP, name)
        record = self._record(STEP, name, occurrence)
        if record is not None and record.state == DONE:
            return record.result
        started = timezone.now()
        try:
            value = self._storable(name, fn(*args, **kwargs))
        except Exception as e:
            self._failed(name, occurrence, started, e)
            raise
        return self._done(name, occurrence, started, value)

    async def astep(self, name: str, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        occurrence = self._next(STEP, name)
        record = await sync_to_async(self._record)(STEP, name, occurrence)
        if record is not None and record.state == DONE:
            return record.result
        started = timezone.now()
        try:
            value = fn(*args, **kwargs)
            if isawaitable(value):
                value = await value
            value = self._storable(name, value)
        except Exception as e:
            await sync_to_async(self._failed)(name, occurrence, started, e)
            raise
        return await sync_to_async(self._done)(name, occurrence, started, value)

    def _storable(self, name: str, value: Any) -> Any:
        """``value`` as it is stored (normalized JSON); raise if it cannot be."""
        try:
            check_json(value, f"The result of step {name!r}")
        except InvalidTaskArguments as e:
            raise InvalidStep(str(e)) from None
        value = normalized(value)
        if self.max_bytes is not None:
            size = len(dumps(value))
            if size > self.max_bytes:
                raise PayloadTooLarge(
                    f"The result of step {name!r} encodes to {size} bytes, over the "
                    f"MAX_PAYLOAD_BYTES limit of {self.max_bytes}: store large results "
                    "elsewhere and return their key."
                )
        return value

    def _done(self, name: str, occurrence: int, started: datetime, value: Any) -> Any:
        """Record the step as done with ``value``; return the result stored (another run's,
        if it recorded this step first)."""
        fields = {"state": DONE, "result": value, "error": "", "started_at": started}
        fields["finished_at"] = timezone.now()
        stored = self._store(STEP, name, occurrence, fields)
        return stored.result

    def _failed(self, name: str, occurrence: int, started: datetime, error: BaseException) -> None:
        """Record that the step raised ``error``; a record that cannot be written is logged
        (the task's own error goes on to its retry policy either way)."""
        kind = type(error)
        text = "".join(traceback.format_exception(error))
        fields = {
            "state": FAILED,
            "result": None,
            "error": storable_class_path(f"{kind.__module__}.{kind.__qualname__}")
            + "\n"
            + storable_traceback(text),
            "started_at": started,
            "finished_at": timezone.now(),
        }
        try:
            self._store(STEP, name, occurrence, fields)
        except Exception:
            logger.warning(
                "Task id=%s: the failure of step %r could not be recorded",
                self.task_id,
                name,
                exc_info=True,
            )

    def _store(self, kind: str, name: str, occurrence: int, fields: dict[str, Any]) -> StepRecord:
        """``_write`` the record of (kind, name, occurrence), riding out a lost connection: a
        try whose commit went unconfirmed is found by what it wrote (its own finished_at)."""

        def store(again: bool) -> StepRecord:
            record = self._record(kind, name, occurrence)
            if (
                again
                and record is not None
                and record.state == fields["state"]
                and record.finished_at == fields["finished_at"]
            ):
                return record
            return self._write(record, kind, name, occurrence, fields)

        return self._retrying(store, f"recording {kind} {name!r}")

    def _write(
        self,
        record: StepRecord | None,
        kind: str,
        name: str,
        occurrence: int,
        fields: dict[str, Any],
    ) -> StepRecord:
        """Insert or update the record of (kind, name, occurrence) with ``fields``, counting a
        run; a record found DONE (written by another run) is kept as it is, and returned."""

        def mine() -> QuerySet[StepRecord]:  # built when needed: most steps need it not
            return StepRecord.objects.using(self.database).filter(
                task_id=self.task_id, kind=kind, name=name, occurrence=occurrence
            )

        if record is not None and record.state != DONE:
            if mine().exclude(state=DONE).update(attempts=F("attempts") + 1, **fields):
                record = _with(record, fields)
                self._remember(record)
                return record
            # DONE by another run meanwhile, or gone with the transaction that wrote it.
            record = mine().first()
        if record is None:
            try:
                record = self._insert(
                    task_id=self.task_id,
                    kind=kind,
                    name=name,
                    occurrence=occurrence,
                    attempts=1,
                    **fields,
                )
            except IntegrityError:  # recorded by another run of the task meanwhile
                record = mine().get()
        self._remember(record)
        return record

    def _insert(self, **values: Any) -> StepRecord:
        """Insert one record (one statement of the dialect's); inside a transaction, in a
        savepoint, so that a duplicate (an IntegrityError) leaves the transaction usable."""
        record = StepRecord(**{"error": "", "result": None, "event_key": None, **values})
        row = {column: getattr(record, column) for column in STEP_COLUMNS}
        connection = connections[self.database]
        if not connection.in_atomic_block:
            with connection.cursor() as cursor:
                dialect_for(connection).insert_step(cursor, **row)
            return record
        with transaction.atomic(using=self.database), connection.cursor() as cursor:
            dialect_for(connection).insert_step(cursor, **row)
        return record

    def add_to_group(self, steps: Sequence[Any]) -> list[str]:
        """Add ``steps`` to this task's group, once: the add and its record commit together."""
        self._record(STEP, "add_to_group", 0)  # read the records first (see store/workflows)
        seen = dict(self._seen)

        def add(again: bool) -> list[str]:
            self._seen = dict(seen)  # a call run again is the same occurrence
            # SQLite: a transaction that reads first (the step's record, the task's workflow)
            # could not take the write lock once another connection had written: take it first.
            connection = connections[self.database]
            with dialect_for(connection).write_transaction():
                added: list[str] = self.step(
                    "add_to_group",
                    new_workflows.add_to_group,
                    (self.backend, self.task_id, steps),
                    {},
                )
            return added

        return self._retrying(add, "adding to its group")

    async def aadd_to_group(self, steps: Sequence[Any]) -> list[str]:
        added: list[str] = await sync_to_async(self.add_to_group)(steps)
        return added

    def _retrying(self, fn: Callable[[bool], T], doing: str) -> T:
        """``fn(again)``, database calls of our own, run again on a new connection while the
        database is away or other transactions hold it up, for up to RETRY_SECONDS; ``again``
        is True on a try after a failed one, which may have committed (the records are read
        again first). Inside the caller's transaction, once: its statements went with it."""
        if connections[self.database].in_atomic_block:
            return fn(False)
        tries = 0

        def attempt() -> T:
            nonlocal tries
            tries += 1
            if tries > 1:
                self._records = None  # what the failed try left, read at the next look-up
            return fn(tries > 1)

        about = f"in task id={self.task_id} ({doing})"
        return run_with_retries(self.database, attempt, within=RETRY_SECONDS, about=about)

    # The records -----------------------------------------------------------------------------

    def _next(self, kind: str, name: str) -> int:
        """The occurrence of this call of ``name``; raise once the attempt has made
        MAX_STEPS_PER_TASK calls, or the task stopped (``Suspended``) already."""
        if self._suspended is not None:
            raise Suspended(self._suspended.until, self._suspended.reason)
        self._calls += 1
        if self._calls > MAX_STEPS_PER_TASK:
            raise InvalidStep(
                f"The task made more than {MAX_STEPS_PER_TASK} step, sleep and wait calls in one "
                "run: a loop that does not end? Split the work into tasks."
            )
        occurrence = self._seen.get((kind, name), 0)
        self._seen[kind, name] = occurrence + 1
        return occurrence

    def _record(self, kind: str, name: str, occurrence: int) -> StepRecord | None:
        if self._records is None:
            self._records = self._retrying(self._read, "reading its steps")
        return self._records.get((kind, name, occurrence))

    def _read(self, again: bool) -> dict[Key, StepRecord]:
        rows = StepRecord.objects.using(self.database).filter(task_id=self.task_id).order_by()
        return {(r.kind, r.name, r.occurrence): r for r in rows}

    def _remember(self, record: StepRecord) -> None:
        if self._records is not None:
            self._records[record.kind, record.name, record.occurrence] = record


def _with(record: StepRecord, fields: dict[str, Any]) -> StepRecord:
    """``record`` as an UPDATE of ``fields`` (and one more run) left it."""
    for name, value in fields.items():
        setattr(record, name, value)
    record.attempts += 1
    return record


def database_now(database: str) -> datetime:
    """The database's time: the clock the claim compares wake times with."""
    connection = connections[database]
    with connection.cursor() as cursor:
        return dialect_for(connection).db_now(cursor)


def forget(database: str, task_ids: list[Any]) -> None:
    """Delete the steps of those of ``task_ids`` whose task is gone (deleted or pruned), and
    release the events they waited for; one statement each, by the step table's index."""
    if not task_ids:
        return
    steps = StepRecord.objects.using(database)
    # Most deleted tasks recorded no step: one read of the step table's index says so.
    durable = set(steps.filter(task_id__in=task_ids).values_list("task_id", flat=True))
    if not durable:
        return
    remaining = TaskRecord.objects.using(database).filter(pk__in=durable)
    gone = durable - set(remaining.values_list("pk", flat=True))
    if not gone:
        return
    steps.filter(task_id__in=gone).delete()
    # The events they waited for or received: one sent later goes to whoever waits next.
    EventRecord.objects.using(database).filter(task_id__in=gone).delete()
