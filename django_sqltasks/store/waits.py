"""Sleeps and waits for events of a durable task's attempt: each puts the task back to READY
until it is due again, holding no worker (see docs/durable.md).

A sleep or a wait stops the attempt where it is: in one transaction, its record is written and
the task row goes from RUNNING (held by this worker) to READY, due at the wake time, its
attempt given back. Then ``Suspended`` unwinds the task, and the worker writes nothing more.
A wait meets its event at the event's row (``EventRecord``, unique per name and key), which
the wait and the send (``store/events.py``) each lock before deciding, so an event sent before,
during or after the wait begins is seen by one of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, connections, transaction
from django.db.models import F, QuerySet, UUIDField, Value
from django.db.models.functions import Coalesce
from django.db.models.lookups import Exact
from django.utils import timezone

from ..compat import TaskResultStatus
from ..core.durable import check_until
from ..exceptions import EventAlreadyAwaited, EventTimeout, InvalidStep, Suspended
from ..models import EventRecord, StepRecord, TaskRecord
from ..sql import dialect_for
from ..sql.expressions import Claims
from ..sql.rows import parked_at
from .steps import StepRecords, database_now


@dataclass(slots=True)
class Met:
    """How a wait met its event: DONE (with its payload), TIMED_OUT, or WAITING (parked)."""

    kind: str
    payload: Any = None
    until: Any = None
    new: list[StepRecord] = field(default_factory=list)
    parked: bool = False


STEP, SLEEP, EVENT = StepRecord.STEP, StepRecord.SLEEP, StepRecord.EVENT
LIVE = (TaskResultStatus.READY, TaskResultStatus.RUNNING)
DONE, FAILED = StepRecord.DONE, StepRecord.FAILED
WAITING, TIMED_OUT = StepRecord.WAITING, StepRecord.TIMED_OUT


class AttemptSteps(StepRecords):
    """The step log of one attempt, its sleeps and waits with its steps: made by the worker on
    the thread that starts the task, and used by that task only (an async task's database
    calls run on asgiref's thread)."""

    def sleep(self, name: str, seconds: float | None, until: datetime | None) -> None:
        self._check_unnested("sleep()")
        occurrence = self._next(SLEEP, name)
        record = self._record(SLEEP, name, occurrence)
        if record is not None and record.state == DONE:
            return
        now = self._now()
        if record is None:
            wake = (
                now + timedelta(seconds=seconds or 0) if until is None else check_until(until, now)
            )
            if wake <= now:
                return  # nothing to wait for, and nothing to record
            record = StepRecord(
                task_id=self.task_id,
                kind=SLEEP,
                name=name,
                occurrence=occurrence,
                state=WAITING,
                wake_at=wake,
                started_at=now,
            )
            self._park([record], wake, f"sleeping until {wake.isoformat()}")
        assert record.wake_at is not None
        if now >= record.wake_at:
            self._store(SLEEP, name, occurrence, {"state": DONE, "finished_at": now})
            return
        self._park([], record.wake_at, f"sleeping until {record.wake_at.isoformat()}")

    async def asleep(self, name: str, seconds: float | None, until: datetime | None) -> None:
        await sync_to_async(self.sleep)(name, seconds, until)

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
        met = self._retrying(
            lambda again: self._meet(name, key, occurrence, timeout, again),
            f"waiting for event {name!r}",
        )
        if met.kind == DONE:
            return met.payload
        if met.kind == TIMED_OUT:
            raise EventTimeout(name, key, met.until)
        self._suspend(
            met.parked, met.new, met.until, f"waiting for event {name!r} with key {key!r}"
        )

    def _meet(
        self, name: str, key: str, occurrence: int, timeout: float | None, again: bool
    ) -> Met:
        """In one transaction, meet the event at its row: take its payload if it was sent,
        time the wait out if its timeout passed, else park the task until it comes. Run
        ``again`` after a try that may have committed: what it did is taken as it was."""
        record = self._record(EVENT, name, occurrence)
        if again and record is not None and record.state in (DONE, TIMED_OUT):
            return Met(record.state, payload=record.result, until=record.wake_at)
        if record is None and not again and not self.depth:
            parked = self._park_at_once(name, key, occurrence, timeout)
            if parked is not None:
                return parked
        with transaction.atomic(using=self.database):
            event = self._rendezvous(name, key)
            if again and not self._held().select_for_update().exists():
                # Parked by that try (and perhaps claimed again since), or taken from us.
                return Met(WAITING, until=parked_at())
            if event.task_id not in (None, self.task_id) and waiter_gone(self.database, event, key):
                # Its waiter ended (cancelled, failed, deleted) without taking it: the key is
                # free again, with the payload if one was sent meanwhile.
                EventRecord.objects.using(self.database).filter(pk=event.pk).update(
                    task_id=self.task_id
                )
                event.task_id = self.task_id
            if event.task_id not in (None, self.task_id):
                raise EventAlreadyAwaited(
                    f"Event {name!r} with key {key!r} is awaited by (or went to) task "
                    f"{event.task_id}: an event goes to one task. Wait for a key of this "
                    "task's own."
                )
            events = EventRecord.objects.using(self.database).filter(pk=event.pk)
            if event.sent_at is not None:
                done = timezone.now()  # shown in the admin only: no database clock needed
                fields = {"state": DONE, "result": event.payload, "finished_at": done}
                if record is None:
                    fields.update(event_key=key, started_at=done)
                stored = self._write(record, EVENT, name, occurrence, fields)
                return Met(DONE, payload=stored.result)
            now = self._now()
            if record is not None and record.wake_at is not None and now >= record.wake_at:
                # Its timeout passed: the event, if it comes, goes to whoever waits next.
                events.update(task_id=None)
                self._write(record, EVENT, name, occurrence, {"state": TIMED_OUT})
                return Met(TIMED_OUT, until=record.wake_at)
            new = []
            if record is None:
                wake = None if timeout is None else now + timedelta(seconds=timeout)
                record = self._waiting(name, key, occurrence, wake_at=wake, started_at=now)
                new.append(record)
            until = record.wake_at or parked_at()
            return Met(WAITING, until=until, new=new, parked=self._park_here(new, until))

    def _park_at_once(
        self, name: str, key: str, occurrence: int, timeout: float | None
    ) -> Met | None:
        """A first wait's park in one statement, where the database has one: most waits find
        their event unsent and free, and are parked so. None if it parked nothing (the event
        was sent, another task waits for it, this attempt lost its claim), and then the
        general way decides, starting from the event's row as this statement left it, the
        way the general way's first statement would. Not in a test's transaction, whose clock
        is the test's (``_now``)."""
        connection = connections[self.database]
        dialect = dialect_for(connection)
        if not dialect.parks_in_one_statement:
            return None
        with connection.cursor() as cursor:
            wait = dialect.park_at_event(
                cursor,
                task_id=self.task_id,
                owner=self.owner,
                attempt=self.attempt,
                claims=self.claims,
                name=name,
                key=key,
                occurrence=occurrence,
                timeout=timeout,
            )
        if wait is None:
            return None
        record = self._waiting(
            name, key, occurrence, wake_at=wait.wake_at, started_at=wait.started_at
        )
        record.pk = wait.step_id
        return Met(WAITING, until=wait.until, new=[record], parked=True)

    def _waiting(
        self, name: str, key: str, occurrence: int, *, wake_at: Any, started_at: Any
    ) -> StepRecord:
        """The record of a wait for event (name, key) that begins at ``started_at``."""
        return StepRecord(
            task_id=self.task_id,
            kind=EVENT,
            name=name,
            occurrence=occurrence,
            state=WAITING,
            event_key=key,
            wake_at=wake_at,
            started_at=started_at,
        )

    def _now(self) -> datetime:
        """The clock wake times are set and read by: the database's, which the claim reads; in
        a test's transaction (``run_tasks``) the test's, as for a snooze: there PostgreSQL's
        clock stands still at the transaction's start."""
        if self.depth:
            return timezone.now()
        return self._retrying(lambda again: database_now(self.database), "reading the clock")

    async def await_event(self, name: str, key: str, timeout: float | None) -> Any:
        return await sync_to_async(self.wait_for_event)(name, key, timeout)

    def _rendezvous(self, name: str, key: str) -> EventRecord:
        """The row of event (name, key), with this task as its waiter if it had none; locked
        until the caller's transaction ends. The first statement writes (an UPDATE, as the
        send's): a lock taken by a read first, then raised to write, would deadlock with a send
        on MySQL, and a SQLite transaction that reads first cannot write once another has."""
        events = EventRecord.objects.using(self.database).filter(name=name, key=key)
        waiter = Coalesce(F("task_id"), Value(self.task_id, output_field=UUIDField()))
        for _ in range(2):
            if events.update(task_id=waiter):
                return events.get()
            try:
                with transaction.atomic(using=self.database):
                    return EventRecord.objects.using(self.database).create(
                        name=name, key=key, task_id=self.task_id
                    )
            except IntegrityError:  # sent, or awaited, since the UPDATE: take it in turn
                continue
        return events.get()  # not reached in practice: the row came and went twice meanwhile

    def _park(self, new: list[StepRecord], until: datetime, reason: str) -> None:
        """Write ``new`` records and put the task back to READY until ``until``, in one
        transaction; then raise ``Suspended``."""

        def park(again: bool) -> bool:
            with transaction.atomic(using=self.database):
                return self._park_here(new, until)

        self._suspend(self._retrying(park, "parking"), new, until, reason)

    def _held(self) -> QuerySet[TaskRecord]:
        """The task's row while this attempt holds it: RUNNING, by this worker, at this
        attempt and under this claim (a park gives the attempt back: the claim after it has
        the same attempt number, and one more worker id)."""
        return (
            TaskRecord.objects.using(self.database)
            .filter(
                pk=self.task_id,
                status=TaskResultStatus.RUNNING,
                owner=self.owner,
                attempts=self.attempt,
            )
            .filter(Exact(Claims(), self.claims))
        )

    def _park_here(self, new: list[StepRecord], until: datetime) -> bool:
        """In the caller's transaction, put the task back to READY until ``until``, its
        attempt given back, and write ``new`` records; return False, and roll the transaction
        back, if this attempt no longer holds the task (its timeout fired and its retry began,
        or a park of this attempt committed already)."""
        parked = self._held().update(
            status=TaskResultStatus.READY,
            owner=None,
            available_at=until,
            attempts=F("attempts") - 1,
        )
        if not parked:
            transaction.set_rollback(True, using=self.database)
            return False
        for record in new:
            record.pk = None  # a try whose transaction rolled back may have set it
            record.save(using=self.database, force_insert=True)
        return True

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

    def _check_unnested(self, what: str) -> None:
        if len(connections[self.database].atomic_blocks) > self.depth:
            raise InvalidStep(
                f"context.{what} cannot be called inside a transaction (transaction.atomic() "
                "or an atomic=True task): the task stops there, and its transaction would "
                "roll back. Call it outside the transaction."
            )


def waiter_gone(database: str, event: EventRecord, key: str) -> bool:
    """Whether ``event``'s waiter ended without taking it: its task is neither READY nor
    RUNNING (cancelled, failed, finished or deleted) and recorded no payload of the event."""
    if event.task_id is None:
        return False
    if TaskRecord.objects.using(database).filter(pk=event.task_id, status__in=LIVE).exists():
        return False
    return (
        not StepRecord.objects.using(database)
        .filter(task_id=event.task_id, kind=EVENT, name=event.name, event_key=key, state=DONE)
        .exists()
    )
