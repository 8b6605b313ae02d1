"""Read the cancel requests of this worker's running tasks at every heartbeat, and hand their
ids to the worker, which cancels them."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from ..lease import Lease
from . import Guarded, Service


class CancelRequests(Service):
    """The ids of this worker's RUNNING tasks whose cancellation was asked, to ``on_requested``."""

    def __init__(self, lease: Lease, on_requested: Callable[[list[uuid.UUID]], None]) -> None:
        super().__init__()
        self.lease = lease
        self._on_requested = on_requested

    def work(self, guarded: Guarded) -> None:
        requested = guarded("Reading cancel requests", self.lease.cancel_requests)
        if requested:
            self._on_requested(requested)
