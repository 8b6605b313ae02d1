"""The step log of one attempt of a durable task: steps recorded as they return, sleeps and
waits that put the task back to READY until it is due again (see docs/durable.md).

A run of the task replays its code from the top; each ``step``, ``sleep`` and
``wait_for_event`` call is numbered by its name (its occurrence), and finds the record an
earlier run left for that number: a finished step returns its stored result without running,
a sleep that is over returns. The records of the task are read once, at the first call.

A sleep or a wait stops the attempt where it is: in one transaction, its record is written and
the task row goes from RUNNING (held by this worker) to READY, due at the wake time, its
attempt given back. Then ``Suspended`` unwinds the task, and the worker writes nothing more.
A wait meets its event at the event's row (``EventRecord``, unique per name and key), which
the wait and the send each lock before deciding, so an event sent before, during or after the
wait begins is seen by one of them (``store/events.py``).
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from inspect import isawaitable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, connections, transaction
from django.db.models import F
from django.utils import timezone

from ..compat import TaskResultStatus
from ..core.durable import MAX_STEPS_PER_TASK, check_until, step_key
from ..core.serialization import check_json, dumps, normalized
from ..core.settings import sql_backend
from ..core.storable import storable_class_path, storable_traceback
from ..exceptions import (
    EventAlreadyAwaited,
    EventTimeout,
    InvalidStep,
    InvalidTaskArguments,
    PayloadTooLarge,
    Suspended,
)
from ..models import EventRecord, StepRecord, TaskRecord
from ..sql import dialect_for
from ..sql.rows import parked_at

logger = logging.getLogger("django_sqltasks")

Key = tuple[str, str, int]  # (kind, name, occurrence)

STEP, SLEEP, EVENT = StepRecord.STEP, StepRecord.SLEEP, StepRecord.EVENT
DONE, FAILED = StepRecord.DONE, StepRecord.FAILED
WAITING, TIMED_OUT = StepRecord.WAITING, StepRecord.TIMED_OUT
SLEEP_NAME = "sleep"  # the name every sleep is numbered under


class AttemptSteps:
    """The step log of one attempt: made by the worker on the thread that starts the task, and
    used by that task only (an async task's database calls run on asgiref's thread)."""

    def __init__(self, *, task_id: uuid.UUID, owner: str, backend_name: str) -> None:
        backend = sql_backend(backend_name)
        self.task_id = task_id
        self.owner = owner  # the worker holding the task: a sleep's write is guarded by it
        self.database = backend.database
        self.max_bytes = backend.config.max_payload_bytes
        # Transactions already open when the task started (a test's): a sleep may not be
        # inside one more (an atomic=True task's, or the task's own transaction.atomic()).
        self.depth = len(connections[self.database].atomic_blocks)
        self._records: dict[Key, StepRecord] | None = None
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
            self._failed(record, name, occurrence, started, e)
            raise
        return self._done(record, name, occurrence, started, value)

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
            await sync_to_async(self._failed)(record, name, occurrence, started, e)
            raise
        return await sync_to_async(self._done)(record, name, occurrence, started, value)

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

    def _done(
        self,
        record: StepRecord | None,
        name: str,
        occurrence: int,
        started: datetime,
        value: Any,
    ) -> Any:
        """Record the step as done with ``value``; return the result stored (another run's,
        if it recorded this step first)."""
        fields = {"state": DONE, "result": value, "error": "", "started_at": started}
        fields["finished_at"] = timezone.now()
        stored = self._write(record, STEP, name, occurrence, fields)
        return stored.result

    def _failed(
        self,
        record: StepRecord | None,
        name: str,
        occurrence: int,
        started: datetime,
        error: BaseException,
    ) -> None:
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
            self._write(record, STEP, name, occurrence, fields)
        except Exception:
            logger.warning(
                "Task id=%s: the failure of step %r could not be recorded",
                self.task_id,
                name,
                exc_info=True,
            )

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
        steps = StepRecord.objects.using(self.database)
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
                record = steps.get(
                    task_id=self.task_id, kind=kind, name=name, occurrence=occurrence
                )
            else:
                self._remember(record)
                return record
        if record.state != DONE:
            changed = (
                steps.filter(pk=record.pk)
                .exclude(state=DONE)
                .update(attempts=F("attempts") + 1, **fields)
            )
            record = steps.get(pk=record.pk) if not changed else _with(record, fields)
        self._remember(record)
        return record

    def _insert(self, **values: Any) -> StepRecord:
        """Insert one record; inside a transaction, in a savepoint, so that a duplicate (an
        IntegrityError) leaves the transaction usable."""
        steps = StepRecord.objects.using(self.database)
        if not connections[self.database].in_atomic_block:
            return steps.create(**values)
        with transaction.atomic(using=self.database):
            return steps.create(**values)

    # Sleeps and waits -----------------------------------------------------------------------

    def sleep(self, seconds: float | None, until: datetime | None) -> None:
        self._check_unnested("sleep()")
        occurrence = self._next(SLEEP, SLEEP_NAME)
        record = self._record(SLEEP, SLEEP_NAME, occurrence)
        if record is not None and record.state == DONE:
            return
        now = database_now(self.database)
        if record is None:
            wake = (
                now + timedelta(seconds=seconds or 0) if until is None else check_until(until, now)
            )
            if wake <= now:
                return  # nothing to wait for, and nothing to record
            record = StepRecord(
                task_id=self.task_id,
                kind=SLEEP,
                name=SLEEP_NAME,
                occurrence=occurrence,
                state=WAITING,
                wake_at=wake,
                started_at=now,
            )
            self._park([record], wake, f"sleeping until {wake.isoformat()}")
        assert record.wake_at is not None
        if now >= record.wake_at:
            self._write(record, SLEEP, SLEEP_NAME, occurrence, {"state": DONE, "finished_at": now})
            return
        self._park([], record.wake_at, f"sleeping until {record.wake_at.isoformat()}")

    async def asleep(self, seconds: float | None, until: datetime | None) -> None:
        await sync_to_async(self.sleep)(seconds, until)

    def wait_for_event(self, name: str, key: str, timeout: float | None) -> Any:
        self._check_unnested("wait_for_event()")
        occurrence = self._next(EVENT, name)
        record = self._record(EVENT, name, occurrence)
        if record is not None:
            if record.event_key != key:
                raise InvalidStep(
                    f"Wait #{occurrence} for event {name!r} is for key {key!r} in this run, "
                    f"but an earlier run waited at this point for key {record.event_key!r}: "
                    "a run must reach its waits with the same keys (see docs/durable.md)."
                )
            if record.state == DONE:
                return record.result
            if record.state == TIMED_OUT:
                raise EventTimeout(name, key, record.wake_at)
        now = database_now(self.database)
        with transaction.atomic(using=self.database):
            event = self._rendezvous(name, key)
            if event.task_id not in (None, self.task_id):
                raise EventAlreadyAwaited(
                    f"Event {name!r} with key {key!r} is awaited by (or went to) task "
                    f"{event.task_id}: an event goes to one task. Wait for a key of this "
                    "task's own."
                )
            events = EventRecord.objects.using(self.database).filter(pk=event.pk)
            if event.task_id is None:
                events.update(task_id=self.task_id)
            if event.sent_at is not None:
                fields = {"state": DONE, "result": event.payload, "finished_at": now}
                if record is None:
                    fields.update(event_key=key, started_at=now)
                return self._write(record, EVENT, name, occurrence, fields).result
            if record is not None and record.wake_at is not None and now >= record.wake_at:
                # Its timeout passed: the event, if it comes, goes to whoever waits next.
                events.update(task_id=None)
                self._write(record, EVENT, name, occurrence, {"state": TIMED_OUT})
                parked = None
            else:
                new = []
                if record is None:
                    wake = None if timeout is None else now + timedelta(seconds=timeout)
                    record = StepRecord(
                        task_id=self.task_id,
                        kind=EVENT,
                        name=name,
                        occurrence=occurrence,
                        state=WAITING,
                        event_key=key,
                        wake_at=wake,
                        started_at=now,
                    )
                    new.append(record)
                until = record.wake_at or parked_at()
                parked = self._park_here(new, until)
        if parked is None:
            raise EventTimeout(name, key, record.wake_at)
        self._suspend(parked, new, until, f"waiting for event {name!r} with key {key!r}")

    async def await_event(self, name: str, key: str, timeout: float | None) -> Any:
        return await sync_to_async(self.wait_for_event)(name, key, timeout)

    def _rendezvous(self, name: str, key: str) -> EventRecord:
        """The row of event (name, key), made with this task as its waiter if it had none;
        locked until the caller's transaction ends."""
        events = EventRecord.objects.using(self.database)
        try:
            with transaction.atomic(using=self.database):
                return events.create(name=name, key=key, task_id=self.task_id)
        except IntegrityError:  # sent already, or awaited: its sender or waiter committed
            return events.select_for_update().get(name=name, key=key)

    def _park(self, new: list[StepRecord], until: datetime, reason: str) -> None:
        """Write ``new`` records and put the task back to READY until ``until``, in one
        transaction; then raise ``Suspended``."""
        with transaction.atomic(using=self.database):
            parked = self._park_here(new, until)
        self._suspend(parked, new, until, reason)

    def _park_here(self, new: list[StepRecord], until: datetime) -> bool:
        """In the caller's transaction, write ``new`` records and put the task back to READY
        until ``until``, its attempt given back; return False, and roll the transaction back,
        if this worker no longer holds the task (its timeout fired, say)."""
        for record in new:
            record.save(using=self.database, force_insert=True)
        parked = (
            TaskRecord.objects.using(self.database)
            .filter(pk=self.task_id, status=TaskResultStatus.RUNNING, owner=self.owner)
            .update(
                status=TaskResultStatus.READY,
                owner=None,
                available_at=until,
                attempts=F("attempts") - 1,
            )
        )
        if not parked:
            transaction.set_rollback(True, using=self.database)
        return bool(parked)

    def _suspend(self, parked: bool, new: list[StepRecord], until: datetime, reason: str) -> None:
        """Raise ``Suspended``: the attempt ends here, whether it parked the task or found it
        held by another worker already."""
        if parked:
            for record in new:
                self._remember(record)
        else:
            reason = "the task is no longer held by this worker"
        self._suspended = Suspended(until, reason)
        raise self._suspended

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
            rows = StepRecord.objects.using(self.database).filter(task_id=self.task_id)
            self._records = {(r.kind, r.name, r.occurrence): r for r in rows}
        return self._records.get((kind, name, occurrence))

    def _remember(self, record: StepRecord) -> None:
        if self._records is not None:
            self._records[record.kind, record.name, record.occurrence] = record

    def _check_unnested(self, what: str) -> None:
        if len(connections[self.database].atomic_blocks) > self.depth:
            raise InvalidStep(
                f"context.{what} cannot be called inside a transaction (transaction.atomic() "
                "or an atomic=True task): the task stops there, and its transaction would "
                "roll back. Call it outside the transaction."
            )


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
    EventRecord.objects.using(database).filter(task_id__in=gone, sent_at__isnull=True).update(
        task_id=None
    )
