"""What a worker's claims cost over the last minute, as its heartbeat publishes it in its row
of the worker table, and the same for several workers together.

The figure is the main claim's (the statement that takes due tasks of no limit; on
PostgreSQL the one that walks the ready index past the dead entries a held snapshot keeps),
timed by the worker around the statement: the round trip and what the server spent on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

CLAIM_WINDOW = 60.0  # seconds of claims a figure covers (less while the worker is younger)


@dataclass(frozen=True)
class ClaimCost:
    """A worker's claims over the last CLAIM_WINDOW seconds; every duration in seconds.

    ``count`` 0 is known: no claim ran in the window (a worker whose slots are all busy, or
    one that has just started); then no duration is known, and each is None, never 0.
    """

    count: int  # claims in the window
    rows: int  # tasks they returned
    mean: float | None = None
    # From a histogram: at least the true 99th percentile, at most 19% above it, never above
    # ``max``. Of several workers, the highest of theirs (at least their combined one).
    p99: float | None = None
    max: float | None = None
    # PostgreSQL, whose claim reads each priority from past what it already took (sql/marks.py)
    # and now and then from the start (a full pass, which walks every dead entry a held
    # snapshot keeps): how many full passes ran, and the slowest. None where claims have no
    # full passes (MariaDB, MySQL, SQLite).
    full_passes: int | None = None
    full_pass_max: float | None = None

    @property
    def rows_per_claim(self) -> float | None:
        return self.rows / self.count if self.count else None


def combine(costs: Iterable[ClaimCost]) -> ClaimCost | None:
    """The claims of several workers as one figure (None if there is none): the mean weighted
    by each one's claims, the highest p99 and max."""
    costs = list(costs)
    if not costs:
        return None
    timed = [(c.mean, c.count) for c in costs if c.count and c.mean is not None]
    timed_count = sum(count for _, count in timed)
    passes = [c.full_passes for c in costs if c.full_passes is not None]
    return ClaimCost(
        count=sum(c.count for c in costs),
        rows=sum(c.rows for c in costs),
        mean=sum(mean * count for mean, count in timed) / timed_count if timed else None,
        p99=_highest(c.p99 for c in costs),
        max=_highest(c.max for c in costs),
        full_passes=sum(passes) if passes else None,
        full_pass_max=_highest(c.full_pass_max for c in costs),
    )


def _highest(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None
