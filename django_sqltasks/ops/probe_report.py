"""What the health probe of ``tasks_health`` (``probe.py``) is given and what it reports: its
limits, each backend's and each queue's health as it saw them, the problems that make it fail
and the exit status they give."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from . import health as table_health
from .claims import (
    DEFAULT_MAX_CLAIM_MEAN,
    DEFAULT_WARN_CLAIM_MEAN,
    BackendClaims,
    ClaimWarning,
)
from .horizon import Holder

DEFAULT_MAX_AGE = 300.0  # seconds a due task may wait before the probe fails: as check W001
# Seconds each database has to answer: under a Kubernetes probe's timeoutSeconds (the docs'
# example gives 10), and far above what the probe's reads take (a few milliseconds).
DEFAULT_TIMEOUT = 5.0
# Seconds a transaction may hold back the cleanup of the task table before the probe fails:
# ten times the age at which W005 warns (a minute), past which the dead rows it keeps cost
# every claim (at 800 tasks/s, about 100,000 of them a minute).
DEFAULT_MAX_TRANSACTION_AGE = 600.0


class Exit(IntEnum):
    """The exit status of ``tasks_health``, one per condition; when several hold, the lowest
    (the one that explains the others) is returned."""

    HEALTHY = 0
    # Nothing can run, whatever the workers do: no backend of this package, one that cannot be
    # loaded or whose OPTIONS are wrong, tables not migrated. (2 is a usage error.)
    MISCONFIGURED = 1
    # A database holding tasks cannot be reached, takes no writes, or did not answer in time.
    DATABASE_UNREACHABLE = 3
    NO_LIVE_WORKER = 4
    QUEUE_UNSERVED = 5
    BACKLOG_TOO_OLD = 6
    HORIZON_HELD = 7  # a transaction has held back the task table's cleanup too long
    CLAIM_SLOW = 8  # the live workers' claims took too long on average over the last minute


@dataclass(frozen=True)
class Problem:
    """One condition that makes the probe fail."""

    exit: Exit
    backend: str | None
    message: str
    queue: str | None = None
    code: str = ""  # the JSON's code: the exit's name, unless a finer one is given

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code or self.exit.name.lower(),
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
    """One backend: its live workers, its queues, and its database's horizon."""

    backend: str
    database: str
    reachable: bool = True
    live_workers: list[str] = field(default_factory=list)
    queues: list[QueueHealth] = field(default_factory=list)
    holder: Holder | None = None  # what holds back the horizon, if anything
    claims: BackendClaims | None = None  # what the live workers' recent claims cost
    upkeep: str = ""  # the task table's upkeep in one line (health.summary)
    notes: list[str] = field(default_factory=list)  # what the probe could not look at

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "database": self.database,
            "reachable": self.reachable,
            "live_workers": self.live_workers,
            "queues": [q.as_dict() for q in self.queues],
            "horizon": None if self.holder is None else self.holder.as_dict(),
            "claims": None if self.claims is None else self.claims.as_dict(),
            "notes": self.notes,
        }


@dataclass
class Report:
    """What ``probe`` found, for every backend it looked at."""

    backends: list[BackendHealth]
    problems: list[Problem]
    warnings: list[table_health.HealthWarning | ClaimWarning] = field(default_factory=list)

    @property
    def exit(self) -> Exit:
        return min((p.exit for p in self.problems), default=Exit.HEALTHY)

    def as_dict(self) -> dict[str, Any]:
        return {
            "healthy": not self.problems,
            "exit": int(self.exit),
            "problems": [p.as_dict() for p in self.problems],
            "warnings": [
                {"id": w.check_id, "message": w.message, "hint": w.hint} for w in self.warnings
            ],
            "backends": [b.as_dict() for b in self.backends],
        }


@dataclass(frozen=True)
class Limits:
    """How long a due task may wait, how long each database has to answer, how long a
    transaction may hold back the task table's cleanup, and the recent claims' mean past which
    the probe warns and fails, in seconds."""

    max_age: float = DEFAULT_MAX_AGE
    timeout: float = DEFAULT_TIMEOUT
    max_transaction_age: float = DEFAULT_MAX_TRANSACTION_AGE
    warn_claim_mean: float = DEFAULT_WARN_CLAIM_MEAN
    max_claim_mean: float = DEFAULT_MAX_CLAIM_MEAN
