"""The health of every queue, read with indexed queries: counts, backlog age, throughput, workers.

Used by the admin's overview page, ``manage.py tasks_status``, the metrics collector and the
stuck-queue check. No query here scans the whole task table: ready and running counts come from
their partial indexes, and finished counts are limited to a recent window of ``finished_at``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

from django.db.models import Count, Min
from django.db.models.functions import Now, TruncMinute
from django.utils import timezone

from ..compat import TaskResultStatus
from ..core.claim_cost import ClaimCost
from ..models import PausedQueue, TaskRecord, TaskRecordQuerySet, WorkerRecord
from ..sql import TableHealth
from . import health as table_health
from .claims import published
from .durations import short_age  # noqa: F401  (read by the admin and tasks_status)

FINISHED_WINDOW = timedelta(hours=1)  # finished counts cover this much recent time
THROUGHPUT_MINUTES = 30  # minutes of per-minute throughput shown in the chart


@dataclass
class QueueStats:
    """One queue of one backend."""

    backend: str
    queue: str
    due: int = 0  # READY and claimable now
    scheduled: int = 0  # READY with a run_after in the future
    running: int = 0
    succeeded: int = 0  # in the finished window
    failed: int = 0  # in the finished window
    oldest_due: datetime | None = None  # the earliest available_at of a due task
    served: bool = False  # a live worker of the backend takes this queue
    paused: bool = False  # no worker claims its tasks until it is resumed
    limited: int = 0  # of the due tasks, those under a task's concurrency or rate limit

    def oldest_age(self, now: datetime) -> timedelta | None:
        """How long the oldest due task has waited to be claimed."""
        return None if self.oldest_due is None else max(now - self.oldest_due, timedelta(0))


@dataclass
class WorkerStats:
    id: str
    backend: str
    queues: list[str]
    hostname: str
    pid: int | None
    concurrency: int
    started_at: datetime
    heartbeat_at: datetime
    running: int = 0
    # What its claims cost over the last minute; None where unknown (ops/claims.py).
    claims: ClaimCost | None = None


@dataclass
class Overview:
    """A snapshot of every queue, the recent throughput, and the live workers."""

    now: datetime
    queues: list[QueueStats]
    workers: list[WorkerStats]
    # (minute, succeeded, failed), oldest first, one entry per minute of the window.
    throughput: list[tuple[datetime, int, int]] = field(default_factory=list)
    finished_window: timedelta = FINISHED_WINDOW
    # The task table's upkeep on this database, and what in it calls for a warning.
    health: TableHealth = field(default_factory=TableHealth)
    warnings: list[table_health.HealthWarning] = field(default_factory=list)


def take(
    using: str = "default",
    backend: str | None = None,
    queue: str | None = None,
    now: datetime | None = None,
    minutes: int = THROUGHPUT_MINUTES,
    health: bool = True,
    configured: Mapping[str, Iterable[str]] | None = None,
) -> Overview:
    """Read a snapshot of the queues of ``backend`` (or all) on database ``using``; with
    ``health``, the task table's upkeep too. The queues in ``configured`` (alias -> QUEUES)
    are listed even with no task, so that one no worker serves shows."""
    now = now or timezone.now()
    tasks = TaskRecord.objects.using(using).order_by().scoped(backend, queue)
    stats: dict[tuple[str, str], QueueStats] = {}

    def entry(backend_name: str, queue_name: str) -> QueueStats:
        key = (backend_name, queue_name)
        if key not in stats:
            stats[key] = QueueStats(backend_name, queue_name)
        return stats[key]

    by_queue = ("backend_name", "queue_name")
    # Each read names limit_key, so that it matches a partial index's predicate (the claim's
    # sqltasks_ready_idx or sqltasks_ready_limited_idx): without it, READY alone matches none,
    # and the count scans the table.
    for limited in (False, True):
        ready = tasks.filter(limit_key__isnull=not limited)
        due = ready.due(now).values(*by_queue).annotate(n=Count("pk"), oldest=Min("available_at"))
        for backend_name, queue_name, n, oldest in due.values_list(*by_queue, "n", "oldest"):
            item = entry(backend_name, queue_name)
            item.due += n
            if item.oldest_due is None or oldest < item.oldest_due:
                item.oldest_due = oldest
            if limited:
                item.limited = n
        scheduled = ready.scheduled(now).values(*by_queue).annotate(n=Count("pk"))
        for backend_name, queue_name, n in scheduled.values_list(*by_queue, "n"):
            entry(backend_name, queue_name).scheduled += n
    running = tasks.running().values(*by_queue).annotate(n=Count("pk"))
    for backend_name, queue_name, n in running.values_list(*by_queue, "n"):
        entry(backend_name, queue_name).running = n
    recent = tasks.finished().filter(finished_at__gt=now - FINISHED_WINDOW)
    finished = recent.values(*by_queue, "status").annotate(n=Count("pk"))
    for backend_name, queue_name, status, n in finished.values_list(*by_queue, "status", "n"):
        item = entry(backend_name, queue_name)
        if status == TaskResultStatus.SUCCESSFUL:
            item.succeeded = n
        else:
            item.failed = n

    paused = PausedQueue.objects.using(using).values_list("backend_name", "queue_name")
    if backend is not None:
        paused = paused.filter(backend_name=backend)
    if queue is not None:
        paused = paused.filter(queue_name=queue)
    for backend_name, queue_name in paused:
        entry(backend_name, queue_name).paused = True  # listed even when empty: to resume it

    for alias, names in (configured or {}).items():
        if backend is None or alias == backend:
            for name in names:
                if queue is None or name == queue:
                    entry(alias, name)

    workers = live_workers(using, backend, now)
    for item in stats.values():
        item.served = any(
            w.backend == item.backend and ("*" in w.queues or item.queue in w.queues)
            for w in workers
        )
    upkeep = table_health.read(using) if health else TableHealth()
    return Overview(
        now=now,
        queues=sorted(stats.values(), key=lambda s: (s.backend, s.queue)),
        workers=workers,
        throughput=throughput(tasks, now, minutes),
        health=upkeep,
        warnings=table_health.warnings(upkeep, using),
    )


def live_workers(
    using: str = "default", backend: str | None = None, now: datetime | None = None
) -> list[WorkerStats]:
    """Workers with a row in the worker table, how many tasks each is running, and what its
    claims cost (judged fresh by the database's clock, read with the rows)."""
    workers = WorkerRecord.objects.using(using).order_by("id").annotate(db_now=Now())
    if backend is not None:
        workers = workers.filter(backend_name=backend)
    running = dict(
        TaskRecord.objects.using(using)
        .running()
        .order_by()
        .values("owner")
        .annotate(n=Count("pk"))
        .values_list("owner", "n")
    )
    return [
        WorkerStats(
            id=w.id,
            backend=w.backend_name,
            queues=list(w.queue_names),
            hostname=w.hostname,
            pid=w.pid,
            concurrency=w.concurrency,
            started_at=w.started_at,
            heartbeat_at=w.heartbeat_at,
            running=running.get(w.id, 0),
            claims=published(w, w.db_now),
        )
        for w in workers
    ]


def throughput(
    tasks: TaskRecordQuerySet, now: datetime, minutes: int
) -> list[tuple[datetime, int, int]]:
    """Tasks finished in each of the last ``minutes`` minutes: (minute, succeeded, failed)."""
    end = now.replace(second=0, microsecond=0)
    start = end - timedelta(minutes=minutes - 1)
    counts: dict[tuple[datetime, str], int] = {}
    rows = (
        tasks.finished()
        .filter(finished_at__gte=start)
        # Truncate in UTC: minutes align in every zone, and MySQL then needs no zone tables.
        .annotate(minute=TruncMinute("finished_at", tzinfo=dt_timezone.utc))
        .values("minute", "status")
        .annotate(n=Count("pk"))
    )
    for row in rows:
        counts[(row["minute"].replace(second=0, microsecond=0), row["status"])] = row["n"]
    series = []
    for i in range(minutes):
        minute = start + timedelta(minutes=i)
        series.append(
            (
                minute,
                counts.get((minute, TaskResultStatus.SUCCESSFUL), 0),
                counts.get((minute, TaskResultStatus.FAILED), 0),
            )
        )
    return series
