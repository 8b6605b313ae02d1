"""Where a worker's next claim starts reading each priority's due tasks: past what its last
claims already took.

Every task a claim takes leaves the version it read, READY, in the ready index; a finish moves
the row out of the live tasks. Vacuum removes those versions only once no snapshot can see
them: while a report, a ``pg_dump`` or a session left in a transaction holds one, they stay,
and a claim that reads each priority's due range from its start walks every one of them (and
their heap tuples) before it reaches a task it can take: 13,000 buffers a claim after three
minutes at 120 tasks/s.

A claim with marks reads each priority from its mark instead: the ``available_at`` of the last
task it took there, held back to before the oldest write still in progress (a task enqueued by
a transaction that commits later may be due earlier than the tasks claimed meanwhile). The
statement itself tells how far back that is: its snapshot's ``xmin`` is the oldest transaction
still writing, and a transaction whose id is at least an earlier snapshot's ``xmax`` began to
write after that snapshot was taken, so whatever it enqueues is due no earlier than then.

What still becomes due behind a mark (a task enqueued with ``run_after`` in the past, a write
open longer than ``MAX_LAG``, a claim that another worker rolled back) is taken by a full pass,
a claim that reads every priority from its start: the first claim, then one at least every
``FULL_PASS_EVERY`` seconds, and no more often than keeps full passes to ``FULL_PASS_SHARE``
of the time (each costs the walk that the marks save, which a held snapshot makes long). A
full pass that took only tasks behind a priority's mark moves that mark back to the last of
them: a backlog behind it is then read by the claims that follow, not ``limit`` tasks a full
pass.

Priorities: the claim walks the priorities that have READY tasks, highest first; one it has a
mark for is not looked up again (reading the index for it would walk its consumed range), the
gaps between them are (a priority new to this worker is found there, and its tasks are read
from their start).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..compat import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY

# A priority's place in the arrays the claim reads (``MARK_BASE`` is PostgreSQL's first
# subscript): the priorities run from TASK_MIN_PRIORITY to TASK_MAX_PRIORITY, and one more
# place above the highest is where the walk starts.
MARK_BASE = 1
WALK_START = TASK_MAX_PRIORITY + 1
SLOTS = WALK_START - TASK_MIN_PRIORITY + 1
# Seconds a mark stays behind the snapshot that set it: a statement that enqueues may read its
# clock (available_at) a moment before it takes its transaction id.
SLOP = timedelta(seconds=0.05)
# Seconds a mark may stay behind the claim at most, whatever write is still open: it bounds
# what the next claim reads (one writer open for minutes would otherwise hold every mark at its
# start). Tasks such a writer enqueues are taken by the next full pass.
MAX_LAG = timedelta(seconds=2)
FULL_PASS_EVERY = 1.0  # seconds between full passes at most, while they stay cheap
# The share of the time, at most, the claim spends on full passes. A task that comes while one
# runs waits for it (30 to 50 ms a pass at 400 tasks/s beside three held snapshots): at 2%, 2%
# of the tasks did, and the p99 start latency was the full pass's (32 ms in the worst 10 s
# against 7.5 ms in the baseline); at 0.5% they stay out of the p99.
FULL_PASS_SHARE = 0.005
FULL_PASS_EVERY_MAX = 60.0  # seconds: how long a full pass that was slow may be put off


NO_MARKS = ("{}", "{}")  # a claim that reads every priority from its start


def array_literal(values: list[int | None] | list[str | None]) -> str:
    """``values`` as a PostgreSQL array literal (none of them needs quoting: numbers, and
    times in ISO 8601)."""
    return "{" + ",".join("NULL" if v is None else str(v) for v in values) + "}"


def full_pass_interval(took: float, every: float = FULL_PASS_EVERY) -> float:
    """Seconds from a full pass that took ``took`` seconds to the next: ``every``, or longer
    where full passes would take more than FULL_PASS_SHARE of the time, up to
    FULL_PASS_EVERY_MAX."""
    return min(max(every, took / FULL_PASS_SHARE), max(every, FULL_PASS_EVERY_MAX))


def slot(priority: int) -> int:
    """The subscript of ``priority`` in the claim's arrays."""
    return priority - TASK_MIN_PRIORITY + MARK_BASE


def parse_time(text: str) -> datetime:
    """A mark's time from its text (ISO 8601 in UTC, with microseconds)."""
    return datetime.fromisoformat(text)


def format_time(value: datetime) -> str:
    """A mark's time as text the database reads back exactly (ISO 8601, microseconds)."""
    return value.isoformat(timespec="microseconds")


@dataclass(frozen=True, slots=True)
class ClaimFeedback:
    """What a claim statement reports besides its rows: the latest ``available_at`` it took of
    each priority, and its snapshot (``xmin``, ``xmax``, the statement's time)."""

    taken: dict[int, datetime]
    xmin: int
    xmax: int
    at: datetime


class ClaimMarks:
    """The marks of one worker's claims of one scope. Owned by the thread that runs those
    claims: every field is read and written there only."""

    def __init__(
        self, full_pass_every: float = FULL_PASS_EVERY, max_lag: timedelta = MAX_LAG
    ) -> None:
        self._full_pass_every = full_pass_every  # seconds between full passes, at least
        self._max_lag = max_lag
        self._marks: dict[int, datetime] = {}
        # (xmax, time) of recent claims' snapshots, oldest first: a write whose transaction id
        # is at least xmax began after that time.
        self._snapshots: deque[tuple[int, datetime]] = deque()
        self._next_full_pass = 0.0  # monotonic time: the first claim is a full pass
        self._full_pass = True  # whether the claim being run is one
        self._started = 0.0
        self.full_passes = 0  # how many full passes ran (for the tests and the metrics)

    def begin(self) -> tuple[str, str]:
        """The arrays for the next claim, as array literals (text: the statement's parameter
        types stay the same, so a prepared claim is prepared once): for each priority slot, the
        highest priority below it that has a mark (the walk's next stop), and the priority's
        mark; empty for a full pass."""
        now = time.monotonic()
        self._started = now
        self._full_pass = now >= self._next_full_pass
        if self._full_pass or not self._marks:
            return NO_MARKS
        below: list[int | None] = [None] * SLOTS
        marks: list[str | None] = [None] * SLOTS
        known = sorted(self._marks, reverse=True)
        nearest: int | None = None
        index = len(known) - 1
        for priority in range(TASK_MIN_PRIORITY, WALK_START + 1):
            while index >= 0 and known[index] < priority:
                nearest = known[index]
                index -= 1
            below[slot(priority) - MARK_BASE] = nearest
        for priority, mark in self._marks.items():
            marks[slot(priority) - MARK_BASE] = format_time(mark)
        return array_literal(below), array_literal(marks)

    def end(self, feedback: ClaimFeedback | None) -> None:
        """Move the marks on from what the claim took (None: it failed; the marks stay)."""
        finished = time.monotonic()
        if self._full_pass:
            self._next_full_pass = finished + full_pass_interval(
                finished - self._started, self._full_pass_every
            )
            if feedback is not None:
                self.full_passes += 1
        if feedback is None:
            return
        bound = self._safe_bound(feedback)
        for priority, taken in feedback.taken.items():
            mark = min(taken, bound)
            current = self._marks.get(priority)
            if current is None or mark > current:
                self._marks[priority] = mark
            elif self._full_pass and taken < current:
                # Every task this full pass took of the priority was behind its mark: more may
                # wait there (an enqueue that took its transaction id late, behind a lock),
                # which claims from the mark would leave to one full pass each ``limit`` of
                # them. From the last one taken, the next claims read them at full pace.
                self._marks[priority] = taken

    def reset(self) -> None:
        """Forget every mark: the next claim is a full pass."""
        self._marks.clear()
        self._snapshots.clear()
        self._next_full_pass = 0.0

    @property
    def marks(self) -> dict[int, datetime]:
        """The current marks by priority (a copy)."""
        return dict(self._marks)

    def _safe_bound(self, feedback: ClaimFeedback) -> datetime:
        """The latest time no write still in progress at ``feedback``'s snapshot can enqueue a
        task before, as far as the recent snapshots tell; never earlier than MAX_LAG before
        the claim."""
        snapshots = self._snapshots
        snapshots.append((feedback.xmax, feedback.at))
        floor = feedback.at - self._max_lag
        while snapshots and snapshots[0][1] < floor:
            snapshots.popleft()
        # The newest snapshot whose xmax no running writer is below: every write in progress
        # took its transaction id after it was taken.
        bound = floor
        newest = None
        for index in range(len(snapshots) - 1, -1, -1):
            xmax, at = snapshots[index]
            if xmax <= feedback.xmin:
                newest = index
                bound = max(floor, at - SLOP)
                break
        if newest is not None:  # older snapshots can no longer be the newest that qualifies
            for _ in range(newest):
                snapshots.popleft()
        return bound
