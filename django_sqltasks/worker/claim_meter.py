"""The cost of a worker's claims over the last minute: each main claim timed where its
statement runs (the database thread, or PostgreSQL's event loop), and summed up for the
heartbeat, which publishes it in the worker's row (``core/claim_cost.py``).

Its cost does not grow with the claim rate: the window is SLICES slices of SLICE seconds
(55 to 60 s of claims: it moves on a slice at a time), each a few sums and a histogram of
durations on a log scale, from which the 99th percentile is read to within RATIO.
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections.abc import Callable

from ..core.claim_cost import CLAIM_WINDOW, ClaimCost

SLICE = 5.0  # seconds of claims per slice of the window
SLICES = int(CLAIM_WINDOW / SLICE)
# The histogram's buckets: bucket i holds durations in (BASE * RATIO**(i-1), BASE * RATIO**i];
# the first also those below, the last those above (BASE * RATIO**(BUCKETS-1): 280 s).
BASE = 1e-5  # seconds: 10 microseconds, below any claim's round trip
RATIO = 2**0.25  # a bucket's upper bound over its lower: the p99 is at most 19% high
BUCKETS = 100
_BOUNDS = [BASE * RATIO**index for index in range(BUCKETS - 1)]


def bucket(seconds: float) -> int:
    """The histogram bucket of a claim that took ``seconds``."""
    return bisect_left(_BOUNDS, seconds)  # past the last bound: the last bucket


def upper_bound(index: int) -> float:
    """The longest duration bucket ``index`` holds (seconds)."""
    return BASE * RATIO**index


class _Slice:
    """The claims of SLICE seconds."""

    __slots__ = (
        "count",
        "full_pass_max",
        "full_passes",
        "histogram",
        "max",
        "number",
        "rows",
        "total",
    )

    def __init__(self, number: int) -> None:
        self.number = number  # which SLICE of the clock it is: its start // SLICE
        self.count = 0
        self.rows = 0
        self.total = 0.0  # seconds
        self.max = 0.0
        self.histogram = [0] * BUCKETS
        self.full_passes = 0
        self.full_pass_max = 0.0


class ClaimMeter:
    """Time a worker's claims and sum them up over the last CLAIM_WINDOW seconds.

    ``record`` runs on the thread that ran the claim (the database thread, or the event loop's
    on PostgreSQL), ``window`` on the database thread (the heartbeat): every field but those
    set here, once, is guarded by ``_lock``.
    """

    def __init__(self, *, full_passes: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.full_passes = full_passes  # whether this database's claims have full passes
        self._clock = clock
        self._lock = threading.Lock()
        self._slices: list[_Slice | None] = [None] * SLICES  # guarded by _lock

    def record(self, seconds: float, rows: int, *, full_pass: bool = False) -> None:
        """Count one claim that took ``seconds`` and returned ``rows`` tasks."""
        number = int(self._clock() // SLICE)
        index = number % SLICES
        with self._lock:
            part = self._slices[index]
            if part is None or part.number != number:
                part = self._slices[index] = _Slice(number)
            part.count += 1
            part.rows += rows
            part.total += seconds
            if seconds > part.max:
                part.max = seconds
            part.histogram[bucket(seconds)] += 1
            if full_pass:
                part.full_passes += 1
                if seconds > part.full_pass_max:
                    part.full_pass_max = seconds

    def window(self) -> ClaimCost:
        """The claims of the last CLAIM_WINDOW seconds (of the worker's life, if shorter)."""
        oldest = int(self._clock() // SLICE) - SLICES + 1
        with self._lock:
            recent = [p for p in self._slices if p is not None and p.number >= oldest]
            count = sum(p.count for p in recent)
            rows = sum(p.rows for p in recent)
            passes = sum(p.full_passes for p in recent)
            cost = ClaimCost(
                count=count,
                rows=rows,
                full_passes=passes if self.full_passes else None,
            )
            if not count:
                return cost
            longest = max(p.max for p in recent)
            histogram = [sum(column) for column in zip(*(p.histogram for p in recent), strict=True)]
            return ClaimCost(
                count=count,
                rows=rows,
                mean=sum(p.total for p in recent) / count,
                p99=min(upper_bound(_rank_bucket(histogram, math.ceil(0.99 * count))), longest),
                max=longest,
                full_passes=cost.full_passes,
                full_pass_max=max(p.full_pass_max for p in recent) if passes else None,
            )


def _rank_bucket(histogram: list[int], rank: int) -> int:
    """The bucket holding the ``rank``-th shortest claim (from 1)."""
    seen = 0
    for index, count in enumerate(histogram):
        seen += count
        if seen >= rank:
            return index
    return len(histogram) - 1
