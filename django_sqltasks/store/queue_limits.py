"""Queue limits changed at run time: an operator's override over ``OPTIONS["QUEUE_LIMITS"]``,
set, cleared and shown with where each limit in force comes from. Workers read the overrides
in their limited claim (``worker/limited.py``), so a change holds on every worker from its
commit on, as the limit itself does (the database counts the RUNNING tasks)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from django.db import connections, transaction
from django.utils import timezone

from ..core.limits import Limit, overridden
from ..models import QueueLimitOverride
from ..sql import dialect_for

SETTINGS = "settings"
OVERRIDE = "override"


@dataclass(frozen=True, slots=True)
class QueueLimitState:
    """One queue's limits: from the settings, the override (None: none), and in force."""

    queue: str
    settings: Limit
    override: Limit | None

    @property
    def in_force(self) -> Limit:
        return overridden(self.settings, self.override)

    @property
    def concurrency_source(self) -> str | None:
        """Where the concurrency limit in force comes from (None: no such limit)."""
        if self.override is not None and self.override.concurrency is not None:
            return OVERRIDE
        return SETTINGS if self.settings.concurrency is not None else None

    @property
    def rate_source(self) -> str | None:
        """Where the rate limit in force comes from (None: no such limit)."""
        if self.override is not None and self.override.rate is not None:
            return OVERRIDE
        return SETTINGS if self.settings.rate is not None else None


def overrides(using: str, alias: str, queues: Collection[str] | None = None) -> dict[str, Limit]:
    """The overrides of the backend ``alias`` by queue (only of ``queues``, if given)."""
    rows = QueueLimitOverride.objects.using(using).filter(backend_name=alias)
    if queues is not None:
        rows = rows.filter(queue_name__in=list(queues))
    fields = ("queue_name", "concurrency", "rate", "period")
    return {q: Limit(concurrency=c, rate=r, period=p) for q, c, r, p in rows.values_list(*fields)}


def states(using: str, alias: str, settings: Mapping[str, Limit]) -> list[QueueLimitState]:
    """Every queue of the backend ``alias`` with a limit in the settings or an override."""
    found = overrides(using, alias)
    return [
        QueueLimitState(queue, settings.get(queue, Limit()), found.get(queue))
        for queue in sorted(set(settings) | set(found))
    ]


def set_override(using: str, alias: str, queue_name: str, limit: Limit, announce: bool) -> bool:
    """Put ``limit`` (each limit None: the settings') in force for ``queue_name`` on every
    worker; return False if it replaced an override. With ``announce``, wake the workers at
    once where the database can (PostgreSQL): a higher limit may let tasks start now."""
    values = {
        "concurrency": limit.concurrency,
        "rate": limit.rate,
        "period": limit.period,
        "updated_at": timezone.now(),
    }
    rows = QueueLimitOverride.objects.using(using).filter(backend_name=alias, queue_name=queue_name)
    # Write first, never read first: on SQLite a transaction that has read cannot take the
    # write lock once a worker has written, and fails at once ("database is locked").
    with transaction.atomic(using=using):
        created = not rows.update(**values)
        if created:
            QueueLimitOverride.objects.using(using).bulk_create(
                [QueueLimitOverride(backend_name=alias, queue_name=queue_name, **values)],
                ignore_conflicts=True,  # another operator's, made meanwhile: ours replaces it
            )
            rows.update(**values)
        if announce:
            _announce(using, queue_name)
    return created


def clear_override(using: str, alias: str, queue_name: str, announce: bool) -> bool:
    """Put the settings' limits of ``queue_name`` back in force (none, if they have none);
    return False if it had no override."""
    with transaction.atomic(using=using):
        deleted, _ = (
            QueueLimitOverride.objects.using(using)
            .filter(backend_name=alias, queue_name=queue_name)
            .delete()
        )
        if deleted and announce:
            _announce(using, queue_name)
    return bool(deleted)


def _announce(using: str, queue_name: str) -> None:
    with connections[using].cursor() as cursor:
        dialect_for(connections[using]).announce(cursor, [queue_name])
