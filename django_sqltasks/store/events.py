"""Events sent to durable tasks (``send_event``), and what operators do to a waiting task: read
what it waits for, send its event, or end its wait (see docs/durable.md).

A send writes the event's row in the caller's transaction; if a task waits for it, the same
transaction makes that task due now, and wakes the workers of its queue at commit (NOTIFY on
PostgreSQL, this process's workers on SQLite). Rolled back, it wakes nothing, and the event was
never sent.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, connections, transaction

from ..compat import DEFAULT_TASK_BACKEND_ALIAS, TaskResultStatus
from ..core.backends import sql_backend
from ..core.durable import SentEvent, check_event
from ..core.serialization import check_json, dumps, normalized
from ..enqueue.wakeup import has_local_listeners, notify_local
from ..exceptions import InvalidStep, InvalidTaskArguments, PayloadTooLarge
from ..models import EventRecord, StepRecord, TaskRecord
from ..sql import dialect_for
from .control import database_now

logger = logging.getLogger("django_sqltasks")
LIVE = (TaskResultStatus.READY, TaskResultStatus.RUNNING)


def send_event(
    name: str, key: Any, payload: Any = None, *, backend: str = DEFAULT_TASK_BACKEND_ALIAS
) -> SentEvent:
    """Send the event ``name`` with ``key`` and a JSON ``payload`` to the task that waits for
    it (``context.wait_for_event``), or will; in the caller's transaction on the database of
    ``backend``. Return what became of it (``SentEvent``: false if it was sent already, the
    first payload standing)."""
    name, key = check_event(name, key)
    config = sql_backend(backend)
    payload = _payload(payload, config.config.max_payload_bytes)
    database = config.database
    connection = connections[database]
    if dialect_for(connection).sends_in_two_statements:
        with transaction.atomic(using=database):
            sent = _send_to_waiter(database, name, key, payload, notify=config.config.notify)
        if sent is not None:
            return sent
    now = database_now(database)
    events = EventRecord.objects.using(database).filter(name=name, key=key)
    # One UPDATE when the task waits already (a webhook after the wait, the usual order); an
    # INSERT when nobody waits yet. Each statement locks the event's row, which the wait locks
    # too (store/waits.py), so the two cannot miss each other. The first statement writes: a
    # SQLite transaction that reads first cannot write once another has.
    with transaction.atomic(using=database):
        for _ in range(2):
            if events.filter(sent_at__isnull=True).update(payload=payload, sent_at=now):
                task_id = events.values_list("task_id", flat=True).get()
                if task_id is None:
                    return SentEvent.STORED
                if wake(database, task_id, notify=config.config.notify, now=now):
                    return SentEvent.RESUMED
                tasks = TaskRecord.objects.using(database).filter(pk=task_id, status__in=LIVE)
                # Running: it takes the event at its wait.
                return SentEvent.RESUMED if tasks.exists() else _waiter_gone(name, key, task_id)
            try:
                with transaction.atomic(using=database):
                    EventRecord.objects.using(database).create(
                        name=name, key=key, payload=payload, sent_at=now
                    )
                return SentEvent.STORED  # nobody waits yet: the wait will find it
            except IntegrityError:  # sent already, or a wait began meanwhile: look again
                continue
    return SentEvent.ALREADY_SENT


def _send_to_waiter(
    database: str, name: str, key: str, payload: Any, *, notify: bool
) -> SentEvent | None:
    """The send of an event whose row exists unsent, in two statements of the dialect's, in
    the caller's transaction; None if there is no such row (then the general way stores it,
    or finds it sent). The second statement is the dialect's own so that it sees a park that
    committed while the first waited for the row's lock: one statement would have read the
    task before that park, and left it parked."""
    connection = connections[database]
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        sent, task_id = dialect.mark_event_sent(cursor, name=name, key=key, payload=payload)
        if not sent:
            return None
        if task_id is None:
            return SentEvent.STORED
        queue, live = dialect.wake_waiter(cursor, task_id, notify=notify)
    if queue is not None and has_local_listeners(database):
        transaction.on_commit(partial(notify_local, database, queue), using=database, robust=True)
    # Not woken but live: due already, or running (it takes the event at its wait).
    return SentEvent.RESUMED if live else _waiter_gone(name, key, task_id)


def _waiter_gone(name: str, key: str, task_id: Any) -> SentEvent:
    logger.warning(
        "Event %r with key %r was sent to task %s, which no longer waits for it "
        "(it was cancelled, failed or deleted): the next task to wait for the key "
        "takes it",
        name,
        key,
        task_id,
        extra={"action": "event_waiter_gone", "task_id": str(task_id)},
    )
    return SentEvent.WAITER_GONE


async def asend_event(
    name: str, key: Any, payload: Any = None, *, backend: str = DEFAULT_TASK_BACKEND_ALIAS
) -> SentEvent:
    """Async ``send_event``."""
    sent: SentEvent = await sync_to_async(send_event)(name, key, payload, backend=backend)
    return sent


def _payload(payload: Any, limit: int | None) -> Any:
    try:
        check_json(payload, "The event payload")
    except InvalidTaskArguments as e:
        raise InvalidStep(str(e)) from None
    payload = normalized(payload)
    if limit is not None:
        size = len(dumps(payload))
        if size > limit:
            raise PayloadTooLarge(
                f"The event payload encodes to {size} bytes, over the MAX_PAYLOAD_BYTES limit "
                f"of {limit}: store large data elsewhere and send its key."
            )
    return payload


def wake(
    database: str, task_id: uuid.UUID, *, notify: bool = True, now: datetime | None = None
) -> bool:
    """Make the READY task ``task_id`` due now (by the database's clock), in the caller's
    transaction, and wake its queue's workers at commit; False if it is not READY."""
    now = now or database_now(database)
    tasks = TaskRecord.objects.using(database).filter(pk=task_id, status=TaskResultStatus.READY)
    if not tasks.filter(available_at__gt=now).update(available_at=now):
        return tasks.exists()
    queue = tasks.values_list("queue_name", flat=True).get()
    connection = connections[database]
    if notify:
        with connection.cursor() as cursor:
            dialect_for(connection).announce(cursor, [queue])
    if has_local_listeners(database):
        transaction.on_commit(partial(notify_local, database, queue), using=database, robust=True)
    return True


# What operators see and do ---------------------------------------------------------------


def steps_of(database: str, task_id: Any) -> list[StepRecord]:
    """The steps, sleeps and waits task ``task_id`` recorded, in the order it first ran them."""
    return list(StepRecord.objects.using(database).filter(task_id=task_id).order_by("id"))


def waiting_for(database: str, task_id: Any) -> StepRecord | None:
    """The sleep or wait task ``task_id`` is stopped at, if any."""
    return (
        StepRecord.objects.using(database)
        .filter(task_id=task_id, state=StepRecord.WAITING)
        .order_by("-id")
        .first()
    )


def end_wait(database: str, task_id: Any, *, notify: bool = True) -> bool:
    """End the sleep or wait of a READY task now: a sleep is over, a wait times out (the task
    gets ``EventTimeout``). Return False if the task is not stopped at one."""
    record = waiting_for(database, task_id)  # before the transaction, which writes first
    if record is None:
        return False
    now = database_now(database)
    with transaction.atomic(using=database):
        steps = StepRecord.objects.using(database).filter(pk=record.pk, state=StepRecord.WAITING)
        if not steps.update(wake_at=now):
            return False
        return wake(database, record.task_id, notify=notify)
