"""The health probe behind ``manage.py tasks_health``: is some worker alive, is every queue
served, has the oldest due task waited too long, can the database be reached.

Fast at any table size: it reads the worker table and the READY rows only, through the ready
indexes (the history of finished tasks is never touched), and the database's clock, so a probe
on a machine whose clock drifts judges workers and tasks as the workers themselves do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import IntEnum
from typing import Any

from django.db import InterfaceError, OperationalError, connections
from django.db.models import Min, QuerySet

from ..core.backends import SQLBackend
from ..models import PausedQueue, TaskRecord, WorkerRecord
from ..sql import dialect_for
from ..sql.installation import is_missing_table, unreachable

DEFAULT_MAX_AGE = 300.0  # seconds a due task may wait before the probe fails: as check W001


class Exit(IntEnum):
    """The exit status of ``tasks_health``, one per condition; when several hold, the lowest
    (the one that explains the others) is returned."""

    HEALTHY = 0
    # 1 is a CommandError (an unknown backend, a database not migrated); 2 is a usage error.
    DATABASE_UNREACHABLE = 3
    NO_LIVE_WORKER = 4
    QUEUE_UNSERVED = 5
    BACKLOG_TOO_OLD = 6


@dataclass(frozen=True)
class Problem:
    """One condition that makes the probe fail."""

    exit: Exit
    backend: str
    message: str
    queue: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.exit.name.lower(),
            "exit": int(self.exit),
            "backend": self.backend,
            "queue": self.queue,
            "message": self.message,
        }


@dataclass
class QueueHealth:
    """One queue of one backend, as the probe saw it."""

    queue: str
    served: bool
    paused: bool
    oldest_due_seconds: float | None = None  # None: nothing due

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "served": self.served,
            "paused": self.paused,
            "oldest_due_seconds": self.oldest_due_seconds,
        }


@dataclass
class BackendHealth:
    """One backend: its live workers and its queues."""

    backend: str
    database: str
    reachable: bool = True
    live_workers: list[str] = field(default_factory=list)
    queues: list[QueueHealth] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "database": self.database,
            "reachable": self.reachable,
            "live_workers": self.live_workers,
            "queues": [q.as_dict() for q in self.queues],
        }


@dataclass
class Report:
    """What ``probe`` found, for every backend it looked at."""

    backends: list[BackendHealth]
    problems: list[Problem]

    @property
    def exit(self) -> Exit:
        return min((p.exit for p in self.problems), default=Exit.HEALTHY)

    def as_dict(self) -> dict[str, Any]:
        return {
            "healthy": not self.problems,
            "exit": int(self.exit),
            "problems": [p.as_dict() for p in self.problems],
            "backends": [b.as_dict() for b in self.backends],
        }


def probe(
    backends: list[SQLBackend],
    queues: list[str] | None = None,
    max_age: float = DEFAULT_MAX_AGE,
) -> Report:
    """Check each backend: a live worker, every queue served, no due task older than
    ``max_age`` seconds. ``queues`` (default: the backend's QUEUES and every queue with a
    due task) narrows the queues checked."""
    found: list[BackendHealth] = []
    problems: list[Problem] = []
    for backend in backends:
        health = BackendHealth(backend.alias, backend.database)
        found.append(health)
        try:
            problems.extend(_check(backend, health, queues, max_age))
        except (OperationalError, InterfaceError) as e:  # a refused or lost connection
            if is_missing_table(e):
                raise
            health.reachable = False
            problems.append(
                Problem(Exit.DATABASE_UNREACHABLE, backend.alias, unreachable(backend.database, e))
            )
    return Report(found, problems)


def _check(
    backend: SQLBackend, health: BackendHealth, queues: list[str] | None, max_age: float
) -> list[Problem]:
    using, alias = backend.database, backend.alias
    connection = connections[using]
    with connection.cursor() as cursor:
        now = dialect_for(connection).db_now(cursor)
    lease = timedelta(seconds=backend.config.lease_timeout)
    workers = list(
        WorkerRecord.objects.using(using)
        .filter(backend_name=alias, heartbeat_at__gte=now - lease)
        .order_by("id")
        .values_list("id", "queue_names")
    )
    health.live_workers = [worker_id for worker_id, _ in workers]
    served: set[str] = {name for _, names in workers for name in names}
    oldest = oldest_due(using, alias, now, queues)
    paused = set(
        PausedQueue.objects.using(using)
        .filter(backend_name=alias)
        .values_list("queue_name", flat=True)
    )
    names = queues if queues is not None else sorted({*backend.queues, *oldest})
    problems: list[Problem] = []
    if not workers:
        problems.append(
            Problem(
                Exit.NO_LIVE_WORKER,
                alias,
                f"No live worker of backend {alias!r}: none has sent a heartbeat in the last "
                f"{lease.total_seconds():g}s (LEASE_TIMEOUT).",
            )
        )
    for name in names:
        due_at = oldest.get(name)
        age = None if due_at is None else max((now - due_at).total_seconds(), 0.0)
        queue = QueueHealth(name, "*" in served or name in served, name in paused, age)
        health.queues.append(queue)
        if workers and not queue.served:
            problems.append(
                Problem(
                    Exit.QUEUE_UNSERVED,
                    alias,
                    f"Queue {name!r} of backend {alias!r} is served by no live worker.",
                    queue=name,
                )
            )
        if age is not None and age > max_age and not queue.paused:
            problems.append(
                Problem(
                    Exit.BACKLOG_TOO_OLD,
                    alias,
                    f"The oldest due task of queue {name!r} of backend {alias!r} has waited "
                    f"{age:.0f}s, over the {max_age:g}s allowed (--max-age).",
                    queue=name,
                )
            )
    return problems


def oldest_due(
    using: str, alias: str, now: datetime, queues: list[str] | None = None
) -> dict[str, datetime]:
    """The earliest ``available_at`` of the due tasks of each queue of backend ``alias``.

    Two reads, one per ready index (tasks without a limit, and tasks under one), so that each
    matches its index's predicate and the history of finished tasks is never scanned.
    """
    oldest: dict[str, datetime] = {}
    for query in due_queries(using, alias, now, queues):
        for row in query:
            queue, at = row["queue_name"], row["oldest"]
            oldest[queue] = min(at, oldest.get(queue, at))
    return oldest


def due_queries(
    using: str, alias: str, now: datetime, queues: list[str] | None = None
) -> list[QuerySet[Any, Any]]:
    """The reads of ``oldest_due``: one through a ready index of unlimited tasks
    (``sqltasks_ready_idx`` or ``sqltasks_ready_all_idx``), one through one of limited tasks
    (``sqltasks_ready_limited_idx`` or ``sqltasks_ready_limited_at_idx``)."""
    due = TaskRecord.objects.using(using).order_by().for_backend(alias).in_queues(queues).due(now)
    return [
        due.filter(limit_key__isnull=unlimited)
        .values("queue_name")
        .annotate(oldest=Min("available_at"))
        for unlimited in (True, False)
    ]
