"""The producer: claims due tasks in batches as slots free up, holds prefetched ones until a slot
frees, and starts them through the executor. Wake-ups (NOTIFY, file watches) cut its sleeps
short; so does a quarter of its room freeing up. Its statements are ``Claims``', run on the
database thread (the main claim, on PostgreSQL, on the loop: ``main_claim``; the suspects'
through ``suspect_claims``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from typing import Any

from ..compat import task_started
from ..sql import ClaimedRow
from .claims import Claims
from .completer import Completer
from .executor import Executor
from .liveness import FailingRoles
from .main_claim import MainClaim
from .receivers import Receivers
from .retries import DatabaseThread
from .slots import Slots
from .suspect_claims import SuspectClaims
from .suspects import Suspects

logger = logging.getLogger("django_sqltasks")

GATHER_DELAY = 0.002  # seconds to let more slots free up before claiming a small batch
SCAN_WHEN_BUSY = 1.0  # seconds between looks for limited tasks while every claim is full
BUSY_POLL = 0.01  # seconds before polling again right after finding work; doubles when idle
NO_END_WAKE = -1  # sleep's wake_at: a task's end does not wake the loop


def _start_order(row: ClaimedRow) -> tuple[int, Any]:
    return -row.priority, row.run_after or row.enqueued_at


class Producer:
    """Claim and start tasks until stopped. The claim loop runs on the event loop; its queries
    on the database thread."""

    def __init__(
        self,
        *,
        sender: type,
        claims: Claims,
        main_claim: MainClaim,
        slots: Slots,
        db: DatabaseThread,
        completer: Completer,
        failing: FailingRoles,
        poll_interval: float,
        burst: bool,
        max_tasks: int | None,
        suspect_bound: float,
    ) -> None:
        # Set once here, read from any thread.
        self.sender = sender
        self.worker_id = claims.worker_id
        self.queue_names = claims.queue_names
        self.slots = slots
        self.poll_interval = poll_interval
        self.burst = burst
        self.max_tasks = max_tasks
        self._claims = claims
        self._main_claim = main_claim
        self._db = db
        self._completer = completer
        self._failing = failing
        # Set by the runner before the loop starts.
        self.executor: Executor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0  # the ident of the thread running the loop
        self._wake: asyncio.Event | None = None
        # Owned by the loop thread.
        self._started: Receivers | None = None  # task_started receivers, as of the last claim
        self._idle_sleep = poll_interval
        self._wake_pending = False  # a wake-up is on its way to the loop (read unlocked)
        # A claim has begun and the loop has not slept since (the claim, taking its rows in,
        # the scan for limited tasks: each may await), and a wake-up came meanwhile: its task
        # may have committed after the claim read the queue. With _stop_unseen below, the
        # wake-ups that sleep()'s clear() must not drop.
        self._claiming = False
        self._woken_in_claim = False
        self._cancels_seen: set[uuid.UUID] = set()  # cancel requests acted on
        self._next_scan = 0.0  # monotonic time a busy worker next looks for limited tasks
        self._stopping = False  # set by stop(): claim no more
        self._stop_unseen = False  # set by stop(), cleared by the next sleep, which it ends
        self._suspects = Suspects(suspect_bound, slots.capacity)
        self._suspect_claims = SuspectClaims(
            self._suspects, claims=claims, slots=slots, db=db, failing=failing
        )

    def attach(self, loop: asyncio.AbstractEventLoop, executor: Executor) -> None:
        """Bind to the running loop and the executor (on the loop thread, before ``run``)."""
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._wake = asyncio.Event()
        self.executor = executor

    # Loop thread --------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """Whether ``stop`` was called."""
        return self._stopping

    def stop(self) -> None:
        """Claim no more, and end the current sleep (on the loop thread, or before it runs)."""
        self._stopping = True
        self._stop_unseen = True
        self.wake()

    async def run(self) -> None:
        """Claim and start tasks until stopped, or until ``burst``/``max_tasks`` is done."""
        capacity = self.slots.capacity
        claims = self._claims
        while not self._stopping:
            if self._suspects.to_clear() is not None:
                await self._suspect_claims.clear()
            held = self.slots.held
            free = capacity - held
            if self.max_tasks is not None:
                claimed = self.slots.claimed
                free = min(free, self.max_tasks - claimed)
                if free <= 0 and claimed >= self.max_tasks:
                    return
            if free <= 0 or (held and free < capacity // 4):
                # Wait for more free slots, so claims come in batches rather than one by one.
                await self.sleep(GATHER_DELAY if free > 0 else self.poll_interval)
                continue
            if self._suspects.may_look(self.slots):
                # The suspects of a first death run beside each other in up to half of the
                # slots; of the others, one at a time runs alone here, in one slot.
                suspects = await self._suspect_claims.claim(free)
                self._hold(suspects, first=True)
                free -= len(suspects)
                if free <= 0:
                    continue
            written_before = self._completer.written
            try:
                self._claiming, self._woken_in_claim = True, False
                rows = await self._main_claim.claim(free)
            except Exception:
                self._claiming = False
                self._failing.failed("claiming")
                logger.exception("Claim failed worker_id=%s; retrying", self.worker_id)
                await self.sleep(self.poll_interval)
                continue
            # _claiming stays set until the next sleep: a wake-up that comes while the rows
            # are taken in or limits scanned (both may await) is not lost to its clear().
            self._failing.succeeded("claiming")
            self._hold(rows)
            if rows and len(rows) >= free:
                self._main_claim.took_all()
            if not claims.limited_active and (
                len(rows) < free or time.monotonic() >= self._next_scan
            ):
                # Look for limited tasks now and then (the scan keeps its own pace), once the
                # claimed tasks have started: never on the way to a task's start. A busy worker
                # looks too, so that limited tasks do not wait for its backlog to run dry.
                self._next_scan = time.monotonic() + SCAN_WHEN_BUSY
                await self._db.call(claims.scan_limits)
            if len(rows) < free:
                if self.burst and not rows and not self.slots.held:
                    # Done only if no outcome was written since this claim began: a retry
                    # written meanwhile is READY again and must be claimed.
                    if self._completer.wait_idle(0) and self._completer.written == written_before:
                        if await self._db.call(claims.suspects_waiting):
                            # Suspects wait (their limits may hold them back): look again.
                            self._suspects.told()
                            await self.sleep(self.poll_interval)
                            continue
                        if not await self._db.call(claims.limited_waiting):
                            return
                        # Due tasks wait on a limit other workers fill: poll for a free slot.
                        await self.sleep(self.poll_interval)
                        continue
                    await asyncio.to_thread(self._completer.wait_idle, 30)
                    continue
                if self._main_claim.told_of_new_tasks():
                    # Every new task wakes this worker, a retry's outcome too: polling would
                    # only repeat the claim that just found the queue drained, as would a
                    # claim at each task's end (half of all claims at 120 tasks/s). A burst
                    # worker wakes when its last task ends, to stop then.
                    await self.sleep(self.poll_interval, wake_at=0 if self.burst else NO_END_WAKE)
                    continue
                # Poll soon after finding work, then back off to the poll interval.
                idle, self._idle_sleep = (
                    (BUSY_POLL, BUSY_POLL * 2)
                    if rows
                    else (self._idle_sleep, min(self.poll_interval, self._idle_sleep * 2))
                )
                await self.sleep(min(idle, self.poll_interval))

    def on_suspects(self) -> None:
        """Suspects wait (told by the heartbeat thread): take them when it can."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                self._loop.call_soon_threadsafe(self._suspects.told)

    async def sleep(self, seconds: float, *, wake_at: int | None = None) -> None:
        """Sleep up to ``seconds``; wake early once a quarter of the room is free (or no more
        than ``wake_at`` tasks are held, at once if so already; ``NO_END_WAKE``: not on any
        task's end), all tasks are done, or a stop is asked."""
        assert self._wake is not None and self.executor is not None
        self._claiming = False
        if self._woken_in_claim:
            # A task announced since the last claim began may have committed after the claim
            # read the queue: claim again now, not after up to a poll interval.
            self._woken_in_claim = False
            return
        if self.executor.threads_waiting():
            seconds = min(seconds, self.executor.spawn_after)
        until_bound = self._suspects.until_bound()
        if until_bound is not None:  # wake to clear the suspect running here at its bound
            seconds = min(seconds, until_bound)
        capacity = self.slots.capacity
        below = capacity - max(1, capacity // 4) if wake_at is None else wake_at
        if self.slots.wake_when_below(below) and wake_at is not None:
            return  # as few are held already: the tasks it waits for ended before this sleep
        self._wake.clear()
        if self._stop_unseen:  # asked while the loop was busy: the clear above dropped its wake
            self._stop_unseen = False
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    def wake(self) -> None:
        """End the current sleep (on the loop thread)."""
        if self._wake is not None:
            self._wake.set()

    def woken_here(self, queue_name: str | None) -> None:
        """A task may have been enqueued (told on the loop thread): claim without waiting."""
        if self._serves(queue_name):
            self._woken()

    def _hold(self, rows: list[ClaimedRow], first: bool = False) -> None:
        """Take claimed rows in: start as many as there are free slots, keep the rest waiting
        (``first``: ahead of the waiting ones)."""
        if not rows:
            return
        self._started = Receivers(task_started, self.sender)
        # A claim returns its rows in no set order: start them in the order the claim chose
        # them (priority, then due time), as a worker claiming one at a time would.
        rows.sort(key=_start_order)
        ready, again = self.slots.hold(rows, first=first)
        for row in again:
            logger.info(
                "Task id=%s was claimed again while this worker holds it: it starts once its "
                "attempt ends, if that attempt stopped at a sleep or a wait",
                row.id,
                extra={"action": "claimed_again", "task_id": row.id, "worker_id": self.worker_id},
            )
        self._start(ready)

    def _start(self, rows: list[ClaimedRow]) -> None:
        if rows:
            assert self.executor is not None and self._started is not None
            if self._suspects.alone is not None:
                self._suspects.on_start({row.id for row in rows})
            self.executor.start(rows, self._started)

    async def release_unstarted(self) -> None:
        """Put claimed tasks that have not started (prefetched ones, and sync ones that no
        thread has taken yet) back to READY: another worker can start them now, instead of
        after this worker's running tasks."""
        assert self.executor is not None
        waiting = self.slots.drop_waiting()
        queued = self.executor.take_unstarted()
        self.slots.let_go(queued)
        if not waiting and not queued:
            return
        count = await self._db.call(
            lambda: self._claims.requeue_owned(
                "The worker stopped before this task started.", keep_known=True
            )
        )
        logger.info(
            "Released %d claimed task(s) that had not started worker_id=%s",
            count,
            self.worker_id,
            extra={"action": "tasks_released", "worker_id": self.worker_id},
        )

    def _cancel(self, task_ids: list[uuid.UUID]) -> None:
        """Cancel each task asked for once: a prefetched one leaves its wait for a slot."""
        assert self.executor is not None
        for task_id in task_ids:
            if task_id not in self._cancels_seen:
                self._cancels_seen.add(task_id)
                dropped = self.slots.drop_waiting(task_id)
                self.executor.cancel(task_id, dropped[0] if dropped else None)

    # Any thread ---------------------------------------------------------------------------

    def on_cancel_requested(self, task_ids: list[uuid.UUID]) -> None:
        """Hand cancel requests (read by the heartbeat thread) over to the loop."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                self._loop.call_soon_threadsafe(self._cancel, task_ids)

    def task_done(self, task_id: uuid.UUID) -> None:
        """A task's function returned (any thread): start a waiting task in its slot, and
        wake the claim loop if it asked."""
        ready, wake, dropped = self.slots.release(task_id)
        if dropped is not None:
            logger.warning(
                "Task id=%s was claimed again while this worker ran it (a server crash lost "
                "the first claim); it was not started twice",
                task_id,
                extra={"action": "not_started_twice", "task_id": task_id},
            )
        self._start(ready)
        if wake and self._loop is not None:
            if threading.get_ident() == self._loop_thread:
                self.wake()  # an async task ended: no need to wake the loop from outside
                return
            with contextlib.suppress(RuntimeError):  # the loop closed during a forced stop
                self._loop.call_soon_threadsafe(self.wake)

    def on_ready_again(self, seconds: float) -> None:
        """A task of this worker went back to READY, due in ``seconds`` (the completer's
        thread): claim it when due, not at the next poll."""
        if self._loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closing
            self._loop.call_soon_threadsafe(self._wake_in, seconds)

    def _wake_in(self, seconds: float) -> None:
        assert self._loop is not None
        if seconds <= 0:
            self._woken()
        elif seconds < self.poll_interval:
            self._loop.call_later(seconds, self._woken)

    def _serves(self, queue_name: str | None) -> bool:
        queues = self.queue_names
        return queue_name is None or queues is None or queue_name in queues

    def on_wake(self, queue_name: str | None) -> None:
        """A task may have been enqueued (from the wake-up thread): claim without waiting."""
        if not self._serves(queue_name):
            return
        if self._wake_pending or self._loop is None:
            return
        self._wake_pending = True
        with contextlib.suppress(RuntimeError):  # the loop is closing
            self._loop.call_soon_threadsafe(self._woken)

    def _woken(self) -> None:
        self._wake_pending = False
        if self._claiming:
            self._woken_in_claim = True
        self._idle_sleep = BUSY_POLL
        self.wake()
