"""Suspects are judged in two rounds. A suspect is a task that was running when its worker died
beside other tasks: any of them may have killed it (see ``Dialect.requeue_orphans``). Most
deaths have no poison task (an OOM kill, a deploy's SIGKILL, a lost host), so the suspects of a
first death run beside each other first, in up to half of a worker's slots (the other half go
on with fresh tasks): they then cost about one task's time per half-worker of them, not their
sum. Those whose worker dies again while they run beside others are
suspects to run alone: a worker runs at most one of them at a time, in one of its slots, while
its other slots run other tasks; if it dies then, the suspect is the one charged. A crash thus
costs each worker one slot, not the worker.

A suspect still running after its time bound (the lease timeout) is cleared: it no longer
counts as running alone, and the worker takes the next suspect. If its worker dies after
that, it comes back as a suspect with no time bound, charged if it kills its worker again."""

from __future__ import annotations

import time
import uuid

from .slots import Slots


class Suspects:
    """Whether suspects may wait, and the one running alone here. Every field is the loop
    thread's (the heartbeat thread's news of suspects reaches it through the loop), but
    ``started``, which the thread that starts the suspect sets."""

    def __init__(self, bound: float, capacity: int) -> None:
        self.bound = bound  # seconds a suspect with a time bound runs alone
        # Suspects of a first death this worker runs at once, at most: half of its slots.
        self.beside_at_most = max(1, capacity // 2)
        self.beside: set[uuid.UUID] = set()  # those running here
        # Suspects may wait: set at start, when told, and by a burst worker that found nothing
        # else; cleared when a look finds none it could take. ``waiting``: of any kind;
        # ``together``: suspects of a first death, which run beside each other.
        self.waiting = True
        self.together = True
        self.alone: uuid.UUID | None = None  # the suspect running alone here, if any
        self.bounded = True  # whether ``alone`` is cleared after ``bound``
        self.started: float | None = None  # monotonic: when ``alone`` started

    def told(self) -> None:
        """Suspects of any kind may wait: look for them."""
        self.waiting = self.together = True

    def may_claim(self, slots: Slots) -> bool:
        """Whether to look for a suspect to run alone now: some may wait, and none runs alone
        here."""
        if self.alone is not None and self.alone not in slots.held_ids():
            self.alone, self.started = None, None  # it ended
        return self.waiting and self.alone is None

    def room_beside(self, slots: Slots) -> int:
        """How many more suspects of a first death may start here now."""
        if self.beside:
            self.beside &= slots.held_ids()  # those that ended
        return self.beside_at_most - len(self.beside) if self.together else 0

    def may_look(self, slots: Slots) -> bool:
        """Whether to look for suspects now: of a first death, or one to run alone."""
        return self.room_beside(slots) > 0 or self.may_claim(slots)

    def looked(self, *, alone: bool, took_alone: bool, beside: int, took_beside: int) -> None:
        """A look for up to ``beside`` suspects of a first death, and (``alone``) one to run
        alone, took ``took_beside`` and ``took_alone``: when it took fewer than it looked for,
        none it could take waits (their limits may hold them back: look again when told)."""
        if took_beside < beside:
            self.together = False
        if alone and not took_alone:
            self.waiting = False

    def took_beside(self, task_id: uuid.UUID) -> None:
        """This worker claimed suspect ``task_id`` of a first death, to run beside others."""
        self.beside.add(task_id)

    def took(self, task_id: uuid.UUID, bounded: bool) -> None:
        """This worker claimed suspect ``task_id`` to run alone."""
        self.alone, self.bounded, self.started = task_id, bounded, None

    def on_start(self, task_ids: set[uuid.UUID]) -> None:
        """Tasks started (any thread): the time bound of the suspect among them begins."""
        if self.alone is not None and self.alone in task_ids and self.started is None:
            self.started = time.monotonic()

    def to_clear(self) -> uuid.UUID | None:
        """The suspect running here past its time bound, if any."""
        started = self.started
        if self.alone is None or not self.bounded or started is None:
            return None
        return self.alone if time.monotonic() - started >= self.bound else None

    def cleared(self) -> None:
        """The suspect running alone here was cleared: take the next one."""
        self.alone, self.started = None, None

    def until_bound(self) -> float | None:
        """Seconds until the suspect running here reaches its time bound (None: none will)."""
        started = self.started
        if self.alone is None or not self.bounded or started is None:
            return None
        return max(0.0, started + self.bound - time.monotonic())
