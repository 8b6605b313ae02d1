"""``TaskQuery``: the tasks of one backend that match a set of filters, for operators and scripts
to count, cancel, retry or delete, in batches.

Every change is made a batch of rows at a time (``batch_size``, 1,000 by default), each batch in
its own short transaction: a million matching tasks are changed without a lock held for long, and
workers go on claiming meanwhile. Batches walk the primary key upwards, so a row the change
leaves alone (a retry refused by a newer live task with the same dedupe key) is passed once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models import Q
from django.utils import timezone

from ..compat import InvalidTask, InvalidTaskBackend, TaskResultStatus
from ..core.backends import sql_backend
from ..core.subject import subject_of
from ..core.tags import MAX_TAG_LENGTH, is_tag
from ..exceptions import InvalidTaskQuery
from ..models import TaskRecord, TaskRecordQuerySet
from ..sql import dialect_for
from ..sql.expressions import HasTag
from . import bulk

BATCH_SIZE = 1000  # rows per batch: each is its own transaction, holding its locks briefly
MAX_BATCH_SIZE = 10_000
STATES = tuple(str(state) for state in TaskResultStatus.values)
CANCEL_REASON = bulk.CANCEL_REASON

When = datetime | timedelta  # a moment, or that long before now


@dataclass(frozen=True)
class Cancelled:
    """What ``TaskQuery.cancel`` did."""

    cancelled: int  # READY tasks now FAILED with a TaskCancelled error
    stop_requested: int  # RUNNING tasks whose worker was asked to stop them

    @property
    def total(self) -> int:
        return self.cancelled + self.stop_requested


class TaskQuery:
    """The tasks of backend ``backend`` that match every filter given (a filter left out, or
    None, matches every task).

    ``state``, ``queue``, ``task`` and ``tag`` take one value or several (any matches): states
    by name (``"FAILED"``, or a ``TaskResultStatus``), queue names, tasks (a ``Task``, or its
    dotted path), tags (as set at enqueue: ``@task(tags=...)``, ``using(tags=...)``).
    ``subject`` takes a saved model instance. The times take an aware ``datetime``, or a
    ``timedelta`` meaning that long ago; ``..._after`` includes its moment and ``..._before``
    does not, so ranges tile without overlap.
    """

    def __init__(
        self,
        *,
        backend: str = "default",
        state: str | Iterable[str] | None = None,
        queue: str | Iterable[str] | None = None,
        task: Any = None,
        tag: str | Iterable[str] | None = None,
        subject: Any = None,
        enqueued_after: When | None = None,
        enqueued_before: When | None = None,
        finished_after: When | None = None,
        finished_before: When | None = None,
    ) -> None:
        try:
            self._backend = sql_backend(backend)
        except InvalidTaskBackend as e:
            raise InvalidTaskQuery(f"backend: {e}") from e
        self.backend = backend
        self.database: str = self._backend.database
        now = timezone.now()
        condition = Q(backend_name=backend)
        if state is not None:
            condition &= Q(status__in=_states(state))
        if queue is not None:
            condition &= Q(queue_name__in=_names("queue", queue))
        if task is not None:
            condition &= Q(task_path__in=_task_paths(task))
        if tag is not None:
            tagged = Q()
            for name in _tags(tag):
                tagged |= Q(HasTag(name))
            condition &= tagged
        if subject is not None:
            try:
                found = subject_of(subject)
            except InvalidTask as e:
                raise InvalidTaskQuery(f"subject: {e}") from e
            condition &= Q(subject_type=found.type, subject_id=found.id)
        for column, after, before in (
            ("enqueued_at", enqueued_after, enqueued_before),
            ("finished_at", finished_after, finished_before),
        ):
            name = column.removesuffix("_at")
            start = None if after is None else _moment(f"{name}_after", after, now)
            end = None if before is None else _moment(f"{name}_before", before, now)
            if start is not None and end is not None and start >= end:
                raise InvalidTaskQuery(
                    f"{name}_after ({start.isoformat()}) is not before {name}_before "
                    f"({end.isoformat()}): no task can match."
                )
            if start is not None:
                condition &= Q(**{f"{column}__gte": start})
            if end is not None:
                condition &= Q(**{f"{column}__lt": end})
        self._condition = condition

    def __repr__(self) -> str:
        return f"<TaskQuery {self._condition!r} on database {self.database!r}>"

    def queryset(self) -> TaskRecordQuerySet:
        """The matching rows, as a ``TaskRecord`` QuerySet (newest first)."""
        return TaskRecord.objects.using(self.database).filter(self._condition)

    def count(self) -> int:
        """How many tasks match, counted."""
        return self.queryset().order_by().count()

    def estimated_count(self) -> int:
        """How many tasks match, as the database's planner estimates it without counting
        (PostgreSQL, MariaDB/MySQL): instant on any table, and the closer the fresher its
        statistics. SQLite makes no estimate: there it is ``count()``."""
        connection = connections[self.database]
        sql, params = self.queryset().order_by().values("pk").query.sql_with_params()
        with connection.cursor() as cursor:
            rows = dialect_for(connection).planned_rows(cursor, sql, params)
        return self.count() if rows is None else rows

    def cancel(
        self, *, reason: str = CANCEL_REASON, running: bool = True, batch_size: int = BATCH_SIZE
    ) -> Cancelled:
        """Cancel the matching READY tasks (FAILED, with a ``TaskCancelled`` error carrying
        ``reason``) and, with ``running``, ask the workers of the matching RUNNING ones to stop
        them (async tasks stop at the next heartbeat; sync ones run to their end)."""
        if not isinstance(reason, str):
            raise InvalidTaskQuery(f"reason: must be text, not {reason!r}.")
        size = _batch_size(batch_size)
        cancelled = self._batches(self.queryset().ready(), size, self._cancel_batch, reason)
        asked = 0
        if running:
            asked = self._batches(
                self.queryset().running().filter(cancel_requested=False),
                size,
                self._ask_to_stop,
                reason,
            )
        return Cancelled(cancelled, asked)

    def retry(self, *, batch_size: int = BATCH_SIZE) -> int:
        """Put the matching FAILED tasks back to READY, due now, keeping their id, errors and
        attempts (as the admin's retry); return how many. A task whose dedupe key a newer live
        task holds stays FAILED: that task will do the work."""
        return self._batches(self.queryset().failed(), _batch_size(batch_size), self._retry_batch)

    def delete(self, *, batch_size: int = BATCH_SIZE) -> int:
        """Delete the matching finished (SUCCESSFUL or FAILED) tasks; return how many. READY
        and RUNNING tasks are never deleted: cancel them first."""
        return self._batches(
            self.queryset().finished(), _batch_size(batch_size), self._delete_batch
        )

    # The batches ------------------------------------------------------------------------------

    def _batches(self, tasks: TaskRecordQuerySet, size: int, change: Any, *args: Any) -> int:
        """Apply ``change`` to the rows of ``tasks``, ``size`` at a time by primary key."""
        done, last = 0, None
        ordered = tasks.order_by("pk")
        while True:
            # One short transaction per batch: the rows it locks are held only while it runs.
            with transaction.atomic(using=self.database):
                page = ordered if last is None else ordered.filter(pk__gt=last)
                ids = list(
                    page.select_for_update(skip_locked=True).values_list("pk", flat=True)[:size]
                )
                if not ids:
                    return done
                done += change(tasks, ids, *args)
            last = ids[-1]

    def _cancel_batch(self, tasks: TaskRecordQuerySet, ids: list[Any], reason: str) -> int:
        return bulk.cancel_ready_batch(self.database, ids, reason)

    def _ask_to_stop(self, tasks: TaskRecordQuerySet, ids: list[Any], reason: str) -> int:
        return bulk.stop_batch(self.database, ids)

    def _retry_batch(self, tasks: TaskRecordQuerySet, ids: list[Any]) -> int:
        return bulk.retry_batch(self.database, ids)

    def _delete_batch(self, tasks: TaskRecordQuerySet, ids: list[Any]) -> int:
        return bulk.delete_batch(self.database, ids)


# Checking the filters -------------------------------------------------------------------------


def _many(value: Any) -> list[Any]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        return [value]
    return list(value)


def _states(value: Any) -> list[str]:
    states = []
    for state in _many(value):
        name = str(state).upper() if isinstance(state, str) else None
        if name not in STATES:
            raise InvalidTaskQuery(
                f"state: {state!r} is not a task state (one of {', '.join(STATES)})."
            )
        states.append(name)
    if not states:
        raise InvalidTaskQuery("state: an empty list matches no task; leave it out for all.")
    return states


def _names(field: str, value: Any) -> list[str]:
    names = _many(value)
    for name in names:
        if not isinstance(name, str) or not name:
            raise InvalidTaskQuery(f"{field}: must be a non-empty name, not {name!r}.")
    if not names:
        raise InvalidTaskQuery(f"{field}: an empty list matches no task; leave it out for all.")
    return names


def _task_paths(value: Any) -> list[str]:
    paths = []
    for task in _many(value):
        path = getattr(task, "module_path", task)
        if not isinstance(path, str) or "." not in path:
            raise InvalidTaskQuery(
                f"task: must be a Task or its dotted path ('app.tasks.send'), not {task!r}."
            )
        paths.append(path)
    if not paths:
        raise InvalidTaskQuery("task: an empty list matches no task; leave it out for all.")
    return paths


def _tags(value: Any) -> list[str]:
    tags = _many(value)
    for tag in tags:
        if not isinstance(tag, str) or not is_tag(tag):
            raise InvalidTaskQuery(
                f"tag: {tag!r} is not a tag (1 to {MAX_TAG_LENGTH} letters, digits or "
                "_ . : / @ = + -)."
            )
    if not tags:
        raise InvalidTaskQuery("tag: an empty list matches no task; leave it out for all.")
    return tags


def _moment(field: str, value: Any, now: datetime) -> datetime:
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise InvalidTaskQuery(
                f"{field}: a timedelta means that long ago; {value} is negative."
            )
        return now - value
    if not isinstance(value, datetime):
        raise InvalidTaskQuery(
            f"{field}: must be a datetime or a timedelta (that long ago), not {value!r}."
        )
    if settings.USE_TZ and timezone.is_naive(value):
        raise InvalidTaskQuery(
            f"{field}: {value.isoformat()} is a naive datetime, which names no moment; give an "
            "aware one (datetime(..., tzinfo=UTC), or django.utils.timezone.make_aware(...))."
        )
    return value


def _batch_size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_BATCH_SIZE:
        raise InvalidTaskQuery(
            f"batch_size: must be a whole number from 1 to {MAX_BATCH_SIZE}, not {value!r}."
        )
    return value
