"""Where the main claim runs: on the event loop's own connection where PostgreSQL's is ready
(``native.py``), else on the database thread (``Claims.claim``); and whether a task that
becomes claimable announces itself to this worker, so that the producer may sleep until told."""

from __future__ import annotations

import logging

from ..sql import ClaimedRow
from .claims import Claims
from .native import LoopDatabase
from .relayed import RelayedWakeups
from .retries import DatabaseThread

logger = logging.getLogger("django_sqltasks")


class MainClaim:
    """Run the main claim for the producer (on the loop thread)."""

    def __init__(self, claims: Claims, db: DatabaseThread) -> None:
        # Set once here.
        self._claims = claims
        self._db = db
        # Set as the loop starts (the worker's listeners), then read on the loop thread.
        self._native: LoopDatabase | None = None  # PostgreSQL's claim on the loop, if any
        self._relay: RelayedWakeups | None = None  # a supervisor's wake-ups, if it relays them

    def on_loop(self, native: LoopDatabase) -> None:
        """Run the main claim on the loop through ``native`` (on the loop thread)."""
        self._native = native

    def relayed_by(self, relay: RelayedWakeups) -> None:
        """Be told of new tasks by a supervisor that listens for this process (on the loop
        thread): ``relay`` says whether it listens, and hears of each claim that took all
        it asked for."""
        self._relay = relay

    def took_all(self) -> None:
        """A claim took all the tasks it asked for: more may wait than this process took, so
        its supervisor, if it relays wake-ups, wakes another."""
        if self._relay is not None:
            self._relay.more()

    def told_of_new_tasks(self) -> bool:
        """Whether a task that becomes claimable wakes this worker: it listens (PostgreSQL),
        or its supervisor listens for it, and no limit is claimed for (a slot of a limit
        frees with no notification)."""
        native, relay = self._native, self._relay
        told = (native is not None and native.listening) or (relay is not None and relay.listening)
        return told and not self._claims.limited_active

    async def claim(self, free: int) -> list[ClaimedRow]:
        """Claim up to ``free`` tasks: on the loop where it can, else on the database thread."""
        native, claims = self._native, self._claims
        if native is None or not native.ready or claims.limited_active or claims.uncertain:
            # Also where the last claim failed or a connection was lost: the thread's claim
            # first puts back what the database says this worker holds and it does not.
            return await self._db.call(claims.claim, free)
        try:
            return await native.claim(free)
        except Exception as e:
            logger.warning(
                "Claim on the event loop failed (%s); claiming on the database thread", e
            )
            # It may have committed: the thread's claim first puts back what it took.
            return await self._db.call(claims.claim, free, True)
