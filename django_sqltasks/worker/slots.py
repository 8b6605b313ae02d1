"""The tasks a worker holds: running ones, at most its concurrency, and claimed ones waiting
for a slot (prefetched)."""

from __future__ import annotations

import threading
import uuid
from collections import deque

from ..sql import ClaimedRow


class Slots:
    """The tasks a worker holds: running ones (at most ``concurrency``) and claimed ones
    waiting for a slot. Used from the loop, the task threads and the heartbeat thread: every
    field is guarded by the lock."""

    def __init__(self, concurrency: int, prefetch: int) -> None:
        self.concurrency = concurrency  # set once
        self.capacity = concurrency + prefetch  # set once: the most tasks held at once
        self._lock = threading.Lock()
        self._claimed = 0  # tasks claimed since start
        self._finished = 0  # claimed tasks whose function returned, or that were let go
        self._active = 0  # tasks started, function not returned yet
        self._held: set[uuid.UUID] = set()  # claimed, function not returned yet
        self._waiting: deque[ClaimedRow] = deque()  # claimed, waiting for a slot
        self._again: dict[uuid.UUID, ClaimedRow] = {}  # held, and claimed again (see hold)
        self._suspended: set[uuid.UUID] = set()  # held, their attempt stopped at a sleep/wait
        self._closing = False  # the worker stops: a row claimed again is left to its requeue
        self._wake_below = -1  # the loop wants waking once this few tasks are held

    @property
    def claimed(self) -> int:
        with self._lock:
            return self._claimed

    @property
    def held(self) -> int:
        """Claimed tasks whose function has not returned yet (running or waiting)."""
        with self._lock:
            return self._claimed - self._finished

    def held_ids(self) -> set[uuid.UUID]:
        with self._lock:
            return set(self._held)

    def hold(
        self, rows: list[ClaimedRow], first: bool = False
    ) -> tuple[list[ClaimedRow], list[ClaimedRow]]:
        """Take claimed rows in (``first``: ahead of those waiting); return those that have a
        slot now (the rest wait), and those this worker holds already, which it does not take
        in a second time.

        A claim takes a task this worker holds in two cases, told apart when its attempt ends
        (``release``). A durable task's attempt put it back to READY at a sleep or a wait, and
        the sleep ended or its event came before the attempt let its slot go: the new claim
        is the task's next run, and starts then. Or a server crash lost an earlier claim's
        commit (CLAIM_SYNCHRONOUS_COMMIT), the row was READY again, and this worker claimed it
        anew while its first attempt ran: that attempt's outcome settles the row (it is
        RUNNING and this worker's again), and the new claim is dropped."""
        with self._lock:
            held = self._held
            ids = [row.id for row in rows]
            again: list[ClaimedRow] = []
            if held and not held.isdisjoint(ids):
                again = [row for row in rows if row.id in held]
                rows = [row for row in rows if row.id not in held]
                ids = [row.id for row in rows]
                self._again.update((row.id, row) for row in again)
            self._claimed += len(rows)
            held.update(ids)
            if first:
                self._waiting.extendleft(reversed(rows))
            else:
                self._waiting.extend(rows)
            return self._take_waiting(), again

    def suspended(self, task_id: uuid.UUID) -> None:
        """The attempt of held task ``task_id`` stopped at a sleep or a wait: its task is
        READY again, and a claim of it before ``release`` is its next run."""
        with self._lock:
            self._suspended.add(task_id)

    def release(self, task_id: uuid.UUID) -> tuple[list[ClaimedRow], bool, ClaimedRow | None]:
        """A task's function returned: free its slot. Return the waiting rows to start in it,
        whether the loop asked to be woken, and the row of this task claimed again meanwhile
        that is dropped (its first attempt's outcome settles it; see ``hold``)."""
        with self._lock:
            self._finished += 1
            self._active -= 1
            self._held.discard(task_id)
            dropped = None
            if self._again or self._suspended:  # rare: no id hashed for a task's end otherwise
                again = self._again.pop(task_id, None)
                if task_id in self._suspended:
                    self._suspended.discard(task_id)
                    if again is not None and not self._closing:
                        # The task's next run: first in line, in the slot just freed.
                        self._claimed += 1
                        self._held.add(task_id)
                        self._waiting.appendleft(again)
                else:
                    dropped = again
            ready = self._take_waiting() if self._waiting else []
            wake = self._claimed - self._finished <= self._wake_below
            if wake:
                self._wake_below = -1  # once is enough until the loop sleeps again
        return ready, wake, dropped

    def let_go(self, rows: list[ClaimedRow]) -> None:
        """Stop counting ``rows`` as held: they were taken back before they started."""
        with self._lock:
            self._finished += len(rows)
            self._active -= len(rows)
            self._held.difference_update(row.id for row in rows)

    def drop_waiting(self, task_id: uuid.UUID | None = None) -> list[ClaimedRow]:
        """Take the waiting rows (or the one with ``task_id``) out: they will not start here
        and no longer count as held. Return them."""
        with self._lock:
            if task_id is None:  # the worker stops
                self._closing = True
                dropped = list(self._waiting)
                self._waiting.clear()
            else:
                dropped = [row for row in self._waiting if row.id == task_id]
                for row in dropped:
                    self._waiting.remove(row)
            self._finished += len(dropped)
            self._held.difference_update(row.id for row in dropped)
        return dropped

    def wake_when_below(self, count: int) -> bool:
        """Have ``release`` ask for the loop's wake once no more than ``count`` tasks are held;
        return whether that many or fewer are held already (the wake would never come)."""
        with self._lock:
            self._wake_below = count
            return self._claimed - self._finished <= count

    def _take_waiting(self) -> list[ClaimedRow]:
        """Pop the waiting rows that free slots can start (with the lock held)."""
        count = min(len(self._waiting), self.concurrency - self._active)
        if count <= 0:
            return []
        self._active += count
        return [self._waiting.popleft() for _ in range(count)]
