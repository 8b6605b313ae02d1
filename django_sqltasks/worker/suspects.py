"""Suspects run alone. A suspect is a task that was running when its worker died beside other
tasks: any of them may have killed it (see ``Dialect.requeue_orphans``). A worker takes one
only once its own running tasks have ended, and claims nothing else while it runs, so that a
task that kills its worker again is the one charged."""

from __future__ import annotations

import enum
import time
import uuid

from .slots import Slots

# To take a suspect, a busy worker stops claiming until its running tasks end, for up to
# DRAIN_LIMIT seconds; if they run longer, it claims as usual and tries again DRAIN_PAUSE
# seconds later.
DRAIN_LIMIT = 30.0
DRAIN_PAUSE = 60.0


class Step(enum.Enum):
    """What the claim loop does about suspects this round."""

    WAIT = "wait"  # sleep: a suspect runs alone, or the running tasks end so that one can start
    CLAIM = "claim"  # claim a suspect, to run alone
    PASS = "pass"  # claim as usual


class Suspects:
    """Whether suspects may wait, and the one running alone here. Every field is the loop
    thread's (the heartbeat thread's news of suspects reaches it through the loop)."""

    def __init__(self) -> None:
        # Suspects may wait: set at start, when told, and by a burst worker that found nothing
        # else; cleared when a look finds none.
        self.waiting = True
        self.alone: uuid.UUID | None = None  # the suspect running alone here, if any
        self._drain_since: float | None = None  # monotonic: when this worker began to drain
        self._next_drain = 0.0  # monotonic: no drain before (after one that ran too long)

    @property
    def pending(self) -> bool:
        """Whether the claim loop has suspects to see to (one runs, or some may wait)."""
        return self.alone is not None or self.waiting

    def next_step(self, slots: Slots, may_claim: bool) -> Step:
        """While a suspect runs, wait for it; to take one, let the running tasks end first
        (for up to DRAIN_LIMIT); ``may_claim`` False (--max-tasks reached) passes."""
        if self.alone is not None:
            if self.alone in slots.held_ids():
                return Step.WAIT
            self.alone = None
        if not self.waiting:
            return Step.PASS
        now = time.monotonic()
        if slots.held:
            if now < self._next_drain:
                return Step.PASS
            if self._drain_since is None:
                self._drain_since = now
            if now - self._drain_since < DRAIN_LIMIT:
                return Step.WAIT
            # Its tasks run long: claim as usual for now; another worker, or this one once
            # idle, takes the suspects meanwhile.
            self._drain_since, self._next_drain = None, now + DRAIN_PAUSE
            return Step.PASS
        self._drain_since = None
        return Step.CLAIM if may_claim else Step.PASS
