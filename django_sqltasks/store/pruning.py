"""Prune old finished tasks (and workflows): on PostgreSQL, drop the days of history past their
retention (store/partitions.py); then delete what is left in small batches, so no statement
holds locks for long."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from ..compat import TaskResultStatus
from ..ids import first_id_at
from ..models import EventRecord, StepRecord, TaskRecord, WorkflowRecord
from . import steps
from .moved import rerun_if_moved
from .partitions import drop_before, straddled_day

logger = logging.getLogger("django_sqltasks")

DEFAULT_SUCCESSFUL_DAYS = 14.0  # long enough to look into last week's results
DEFAULT_FAILED_DAYS = 30.0  # failures are kept longer: someone may still need the traceback
# tasks_prune's: an event nobody waited for two weeks after it was sent is most likely a key
# no task will wait for (a webhook for an order no flow runs for).
DEFAULT_UNCLAIMED_EVENT_DAYS = 14.0
BATCH_SIZE = 1000  # rows per DELETE: each batch is its own short transaction


@dataclass
class Pruned:
    """How many finished tasks were (or, in a dry run, would be) deleted."""

    successful: int = 0
    failed: int = 0
    workflows: int = 0  # finished workflows (not counted in ``total``, which counts tasks)
    events: int = 0  # unclaimed events (not counted in ``total`` either)
    partitions: int = 0  # day partitions dropped whole (PostgreSQL); their tasks are counted
    # PostgreSQL without ``exact``: when the old tasks of the day the cutoff falls in, kept for
    # now, go with their day's partition (None: no such task was kept).
    kept_until: datetime | None = None

    @property
    def total(self) -> int:
        return self.successful + self.failed


def prune(
    *,
    using: str,
    successful_days: float | None = DEFAULT_SUCCESSFUL_DAYS,
    failed_days: float | None = DEFAULT_FAILED_DAYS,
    backend: str | None = None,
    queue: str | None = None,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
    max_batches: int | None = None,
    now: datetime | None = None,
    exact: bool = False,
    unclaimed_event_days: float | None = None,
) -> Pruned:
    """Delete tasks that finished more than the given days ago; ``None`` keeps that status.

    ``max_batches`` bounds the work of one call per status (the worker prunes a little at a time).
    On PostgreSQL's partitioned table, the tasks of the day the cutoff falls in are kept until
    that whole day is past it (at most a day longer), and then dropped with it, unless
    ``exact``: then they are deleted now, in batches, as on the other databases.
    """
    now = now or timezone.now()
    tasks = TaskRecord.objects.using(using).order_by().scoped(backend, queue)
    pruned = Pruned()
    dropped_before: datetime | None = None  # the latest cutoff a dropped partition ended by
    for status, days in (
        (TaskResultStatus.SUCCESSFUL, successful_days),
        (TaskResultStatus.FAILED, failed_days),
    ):
        if days is None:
            continue
        cutoff = now - timedelta(days=days)
        count = 0
        if not dry_run:
            # Whole days first: a DROP of each partition past the cutoff, whatever its size.
            dropped = drop_before(using, status, cutoff, backend=backend, queue=queue)
            count, pruned.partitions = dropped.tasks, pruned.partitions + len(dropped.partitions)
            if dropped.partitions:
                dropped_before = max(dropped_before or cutoff, cutoff)
        old = tasks.filter(status=status)
        day = None if exact else straddled_day(using, status, cutoff)
        if day is None:
            old = old.filter(finished_at__lte=cutoff)
        else:  # the default partition's tasks older than that day, if any
            kept = tasks.filter(status=status, finished_at__gte=day.start, finished_at__lte=cutoff)
            if kept.exists():  # one probe of the finished index
                until = day.end + timedelta(days=days)  # when the cutoff passes the day
                pruned.kept_until = max(pruned.kept_until or until, until)
            old = old.filter(finished_at__lt=day.start)
        count += _delete(old, dry_run, batch_size, max_batches)
        if status == TaskResultStatus.SUCCESSFUL:
            pruned.successful = count
        else:
            pruned.failed = count
    if dropped_before is not None:
        # A dropped day's tasks went without their ids: the steps of tasks enqueued before
        # the cutoff whose task is gone go now (their ids are older than the cutoff's).
        _forget_steps_before(using, dropped_before, batch_size)
    if queue is None:  # a workflow's steps may be in several queues
        pruned.workflows = _prune_workflows(
            using, backend, successful_days, failed_days, now, dry_run, batch_size, max_batches
        )
    if unclaimed_event_days is not None:
        pruned.events = prune_unclaimed_events(
            using, unclaimed_event_days, now, dry_run, batch_size, max_batches
        )
    if pruned.total and not dry_run:
        logger.info(
            "Pruned finished tasks successful=%d failed=%d partitions=%d",
            pruned.successful,
            pruned.failed,
            pruned.partitions,
            extra={
                "action": "prune",
                "successful": pruned.successful,
                "failed": pruned.failed,
                "partitions": pruned.partitions,
            },
        )
    return pruned


def prune_unclaimed_events(
    using: str,
    days: float,
    now: datetime,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
    max_batches: int | None = None,
) -> int:
    """Delete the events sent more than ``days`` ago for a key no task waits for (one range
    of sqltasks_event_unclaimed_idx per batch). The table holds the events of every backend
    on the database: their keys are shared."""
    unclaimed = EventRecord.objects.using(using).filter(
        task_id__isnull=True, sent_at__lte=now - timedelta(days=days)
    )
    count = _delete(unclaimed.order_by(), dry_run, batch_size, max_batches)
    if count and not dry_run:
        logger.info(
            "Pruned %d unclaimed event(s) sent over %g days ago",
            count,
            days,
            extra={"action": "prune_events", "events": count},
        )
    return count


def _prune_workflows(
    using: str,
    backend: str | None,
    successful_days: float | None,
    failed_days: float | None,
    now: datetime,
    dry_run: bool,
    batch_size: int,
    max_batches: int | None,
) -> int:
    """Delete finished workflows as old as the tasks of their outcome that are deleted."""
    workflows = WorkflowRecord.objects.using(using).order_by()
    if backend is not None:
        workflows = workflows.filter(backend_name=backend)
    deleted = 0
    for status, days in (
        (TaskResultStatus.SUCCESSFUL, successful_days),
        (TaskResultStatus.FAILED, failed_days),
    ):
        if days is not None:
            cutoff = now - timedelta(days=days)
            old = workflows.filter(status=status, finished_at__lte=cutoff)
            deleted += _delete(old, dry_run, batch_size, max_batches)
    return deleted


def _forget_steps_before(using: str, cutoff: datetime, batch_size: int) -> None:
    """Delete the steps (and events) of tasks enqueued before ``cutoff`` that no longer exist,
    reading the step table's index by task id (UUIDv7: in enqueue order) a batch at a time."""
    candidates = (
        StepRecord.objects.using(using)
        .filter(task_id__lt=first_id_at(cutoff))
        .order_by("task_id")
        .values_list("task_id", flat=True)
    )
    after = None
    while True:
        batch = candidates if after is None else candidates.filter(task_id__gt=after)
        ids = list(dict.fromkeys(batch[:batch_size]))
        if not ids:
            return
        steps.forget(using, ids)
        after = ids[-1]


def _delete(tasks: QuerySet[Any], dry_run: bool, batch_size: int, max_batches: int | None) -> int:
    if dry_run:
        return tasks.count()
    deleted = 0
    batches = 0
    while max_batches is None or batches < max_batches:
        # Select a batch of keys through the finished index, then delete by primary key: each
        # DELETE locks at most batch_size rows, and only for its own autocommit statement.
        ids = list(tasks.values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        # Keep the status and age conditions: a task retried meanwhile is READY and must stay.
        # A task retried meanwhile moved partition (PostgreSQL): delete again without it.
        count, _ = rerun_if_moved(tasks.db, tasks.filter(pk__in=ids).delete)
        if tasks.model is TaskRecord:
            steps.forget(tasks.db, ids)
        deleted += count
        batches += 1
        if len(ids) < batch_size:
            break
    return deleted


PRUNE_INTERVAL = 600.0  # seconds between a worker's retention runs once it has caught up
RETENTION_BATCHES = 5  # batches per run, so one run holds the worker's database thread briefly


class Retention:
    """Apply a backend's PRUNE_SUCCESSFUL_DAYS, PRUNE_FAILED_DAYS and
    PRUNE_UNCLAIMED_EVENT_DAYS from a worker's heartbeat."""

    def __init__(
        self,
        *,
        backend: str,
        using: str,
        successful_days: float | None,
        failed_days: float | None,
        unclaimed_event_days: float | None = None,
        interval: float = PRUNE_INTERVAL,
    ) -> None:
        self.backend = backend
        self.using = using
        self.successful_days = successful_days
        self.failed_days = failed_days
        self.unclaimed_event_days = unclaimed_event_days
        self.interval = interval
        self._next = 0.0  # monotonic time of the next run; 0 runs at the first heartbeat

    @classmethod
    def for_backend(cls, backend: Any) -> Retention | None:
        """Return the backend's retention, or None when no option of it is set."""
        config = backend.config
        days = (
            config.prune_successful_days,
            config.prune_failed_days,
            config.prune_unclaimed_event_days,
        )
        if all(d is None for d in days):
            return None
        return cls(
            backend=backend.alias,
            using=backend.database,
            successful_days=config.prune_successful_days,
            failed_days=config.prune_failed_days,
            unclaimed_event_days=config.prune_unclaimed_event_days,
        )

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def run(self) -> Pruned:
        """Prune up to RETENTION_BATCHES batches per status; come back soon if more remain."""
        pruned = prune(
            using=self.using,
            backend=self.backend,
            successful_days=self.successful_days,
            failed_days=self.failed_days,
            max_batches=RETENTION_BATCHES,
            unclaimed_event_days=self.unclaimed_event_days,
        )
        # Counting the tasks of dropped days too: at worst one more run, which finds nothing.
        full = RETENTION_BATCHES * BATCH_SIZE
        behind = pruned.successful >= full or pruned.failed >= full or pruned.events >= full
        self._next = 0.0 if behind else time.monotonic() + self.interval
        return pruned
