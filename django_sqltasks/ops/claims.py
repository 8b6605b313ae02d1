"""What the live workers' claims cost over the last minute, as their heartbeats publish it in
the worker table (``core/claim_cost.py``): read by the overview (so the admin and the
metrics), and judged by ``tasks_health``.

A figure says no more than it knows: a worker whose row says nothing (an earlier version), or
whose figure is older than its backend's LEASE_TIMEOUT by the database's clock (its heartbeat
stuck, a supervisor renewing its lease meanwhile, or a dead worker's row), is unknown, and so
is the duration of a worker that ran no claim in the window; none reads as 0 ms.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..core.backends import backend_config
from ..core.claim_cost import ClaimCost, combine
from ..core.options import BackendOptions

# Seconds of a recent claim mean past which tasks_health warns. A healthy claim is a fraction
# of a millisecond on PostgreSQL at a steady 120 tasks/s (0.24-0.3 ms, issue 44's figures);
# a worker draining a backlog at full speed (3,000 no-op tasks, concurrency 8, on 2 cores at
# load average 3-7) measured 3.0-4.9 ms on PostgreSQL, 1.8-2.4 ms on SQLite and 6.2-11.9 ms
# on MariaDB, its claims sharing the server with the outcomes. Four times the highest of those:
# a mean past it is a claim that walks a long way (dead rows a held snapshot keeps), waits
# for locks, or meets a database short of CPU or I/O, not a busy queue.
DEFAULT_WARN_CLAIM_MEAN = 0.05
# Seconds past which it fails (exit 8): ten times the warning; every claim then holds its batch
# back for half a second, and a worker's pace is bound by its claims more than by its tasks.
DEFAULT_MAX_CLAIM_MEAN = 0.5


def lease_of(backend: str) -> float:
    """The LEASE_TIMEOUT (seconds) of backend ``backend``; the default for one not set up in
    this process."""
    config = backend_config(backend)
    return (config or BackendOptions()).lease_timeout


def published(record: Any, now: datetime, lease: float | None = None) -> ClaimCost | None:
    """What worker row ``record`` (a ``WorkerRecord``) says its claims cost, if its figure is
    within ``lease`` (default: its backend's LEASE_TIMEOUT) of ``now``, the database's time;
    else None."""
    measured_at = record.claim_measured_at
    if measured_at is None:
        return None
    lease = lease_of(record.backend_name) if lease is None else lease
    if now - measured_at > timedelta(seconds=lease):
        return None
    cost: ClaimCost | None = record.claim_cost
    return cost


@dataclass(frozen=True)
class BackendClaims:
    """The claims of one backend's live workers: their combined figure (None: none of them
    published one), and how many of them it covers."""

    cost: ClaimCost | None
    reporting: int  # live workers whose figure is fresh
    live: int  # live workers

    def as_dict(self) -> dict[str, Any] | None:
        cost = self.cost
        if cost is None:
            return None
        return {
            "workers": self.reporting,
            "count": cost.count,
            "rows": cost.rows,
            "mean_seconds": cost.mean,
            "p99_seconds": cost.p99,
            "max_seconds": cost.max,
            "full_passes": cost.full_passes,
            "full_pass_max_seconds": cost.full_pass_max,
        }


def of_backend(costs: list[ClaimCost | None]) -> BackendClaims:
    """The claims of one backend, from each live worker's figure (None where unknown)."""
    known = [cost for cost in costs if cost is not None]
    return BackendClaims(combine(known), len(known), len(costs))


def milliseconds(seconds: float) -> str:
    """A claim's duration as an operator reads it: 0.31 ms, 4.2 ms, 38 ms, 1,204 ms."""
    ms = seconds * 1000
    if ms < 1:
        return f"{ms:.2f} ms"
    if ms < 10:
        return f"{ms:.1f} ms"
    return f"{ms:,.0f} ms"


def describe(cost: ClaimCost | None) -> str:
    """One worker's (or backend's) claims in a line: what is known, and "unknown" for the
    rest."""
    if cost is None:
        return "unknown (no fresh figure)"
    if not cost.count or cost.mean is None:
        return "no claim in the last minute (duration unknown)"
    return f"{cost.count:,} in the last minute, mean {milliseconds(cost.mean)}, " + _details(cost)


def _details(cost: ClaimCost) -> str:
    """What ``describe`` says after the count and the mean."""
    parts = []
    if cost.p99 is not None:
        parts.append(f"p99 {milliseconds(cost.p99)}")
    if cost.max is not None:
        parts.append(f"max {milliseconds(cost.max)}")
    parts.append(f"{cost.rows / cost.count:.1f} tasks a claim")
    if cost.full_passes:
        slowest = f", the slowest {milliseconds(cost.full_pass_max)}" if cost.full_pass_max else ""
        parts.append(f"{cost.full_passes:,} full pass(es){slowest}")
    return ", ".join(parts)


@dataclass(frozen=True)
class ClaimWarning:
    """``tasks_health``'s warning that a backend's recent claims are slow (beside the task
    table's warnings, and printed as they are)."""

    message: str
    hint: str
    check_id: str = "claim_slow"  # the JSON's warning id


HINT = (
    "See what holds back the cleanup of the task table (its dead rows, the oldest "
    "transaction: the task table's upkeep above), and whether the database is short of CPU or "
    "I/O; docs/operations.md, 'A busy database'."
)


def judged(
    backend: str, claims: BackendClaims, warn: float, fail: float
) -> tuple[ClaimWarning | None, str | None]:
    """What ``tasks_health`` says of ``backend``'s claims: a warning if their mean passes
    ``warn`` seconds, and a problem's message if it passes ``fail`` (None for each if not, or
    if it is unknown)."""
    cost = claims.cost
    if cost is None or cost.mean is None or cost.mean <= warn:
        return None, None
    took = (
        f"The claims of backend {backend!r} took {milliseconds(cost.mean)} on average over "
        "the last minute"
    )
    detail = (
        f" ({cost.count:,} claims, {_details(cost)}; {claims.reporting} of {claims.live} live "
        "worker(s) reporting)."
    )
    warning = ClaimWarning(f"{took}, over {milliseconds(warn)} (--warn-claim-mean){detail}", HINT)
    if cost.mean <= fail:
        return warning, None
    return warning, f"{took}, over the {milliseconds(fail)} allowed (--max-claim-mean){detail}"
