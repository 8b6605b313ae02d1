"""Look at every heartbeat for suspect tasks (see ``Dialect.requeue_orphans``) this worker may
run alone, and tell the worker's producer when one waits."""

from __future__ import annotations

from collections.abc import Callable

from ..lease import Lease
from . import Guarded, Service


class Suspects(Service):
    """Tell ``on_waiting`` (``Producer.on_suspects``) when a suspect task waits."""

    def __init__(self, lease: Lease, on_waiting: Callable[[], None]) -> None:
        super().__init__()
        self.lease = lease
        self._on_waiting = on_waiting

    def work(self, guarded: Guarded) -> None:
        if guarded("Looking for suspect tasks", self.lease.suspects_waiting):
            self._on_waiting()
