"""How a worker hears of new tasks between its claims: from its supervisor, which listens for
it (PostgreSQL under ``tasks_worker --processes``: ``relayed.py``); from PostgreSQL's LISTEN
on the loop's own connection, which the main claim shares (``native.py``); from this
process's enqueues and, on SQLite, the database's files (``wakeup.py``). Each tells the
producer, which claims at once instead of at its next poll."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from django.db import connections

from ..backend import SQLTaskBackend
from ..sql import dialect_for
from .claim_meter import ClaimMeter
from .claims import Claims
from .main_claim import MainClaim
from .native import LoopDatabase
from .producer import Producer
from .relayed import RELAYED_POLL_FACTOR, RelayedWakeups
from .wakeup import Wakeup, wakeup_for

logger = logging.getLogger("django_sqltasks")


@dataclass(kw_only=True)
class Listeners:
    """Start and stop the ways a worker hears of new tasks (on the loop thread)."""

    # Set once, with the worker.
    backend: SQLTaskBackend
    claims: Claims  # the worker's, which name its id and queues
    main_claim: MainClaim
    producer: Producer
    poll_interval: float
    connection_lost: threading.Event
    meter: ClaimMeter
    # The socket through which a supervisor that listens for this process wakes it
    # (PostgreSQL under tasks_worker --processes): this process does not LISTEN.
    relay_fd: int | None
    # Owned by the loop thread.
    _wakeup: Wakeup | None = field(default=None, init=False)
    # PostgreSQL's listen and claim on the loop.
    _native: LoopDatabase | None = field(default=None, init=False)
    _relay: RelayedWakeups | None = field(default=None, init=False)

    async def start(self) -> None:
        """Start listening, each way the database and the process allow."""
        notify = self.backend.config.notify
        if self.relay_fd is not None:
            self._relay = RelayedWakeups(
                self.relay_fd, self.producer.woken_here, self._relay_listening
            )
            self._relay.start()
            self.main_claim.relayed_by(self._relay)
        if LoopDatabase.available(self.backend.database):
            # PostgreSQL: LISTEN and the main claim on the loop.
            self._native = LoopDatabase(
                database=self.backend.database,
                backend_name=self.backend.alias,
                queue_names=self.claims.queue_names,
                worker_id=self.claims.worker_id,
                scope=self.claims.main_scope,
                listen=notify and self._relay is None,
                on_wake=self.producer.woken_here,
                on_lost=self.connection_lost.set,
                listen_database=self.backend.config.listen_database,
                direct=self.backend.config.direct_sessions,
                meter=self.meter,
            )
            await self._native.start()
            self.main_claim.on_loop(self._native)
        elif dialect_for(connections[self.backend.database]).wakeup == "notify" and notify:
            logger.info("psycopg 3 is not installed: workers poll instead of listening")
        self._wakeup = wakeup_for(self.backend.database, self.producer.on_wake)
        self._wakeup.start()

    async def stop(self) -> None:
        """Stop listening, and close the loop's connection."""
        if self._wakeup is not None:
            self._wakeup.stop()
        if self._native is not None:
            await self._native.close()
        if self._relay is not None:
            self._relay.stop()

    def _relay_listening(self, listening: bool) -> None:
        """While the supervisor listens, it polls for this process too: poll less on its own
        (the producer reads its interval at each sleep)."""
        factor = RELAYED_POLL_FACTOR if listening else 1
        self.producer.poll_interval = self.poll_interval * factor
