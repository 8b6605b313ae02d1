"""Apply the backend's retention (PRUNE_SUCCESSFUL_DAYS, PRUNE_FAILED_DAYS,
PRUNE_UNCLAIMED_EVENT_DAYS): ``store.pruning.Retention``, which keeps its own time."""

from __future__ import annotations

from ...store.pruning import Retention
from . import Guarded, Service


class Pruning(Service):
    """A few batches per status once PRUNE_INTERVAL passed, at the next heartbeat while more
    remain (``Retention.due``)."""

    def __init__(self, retention: Retention) -> None:
        super().__init__(interval=retention.interval)
        self.retention = retention

    def due(self) -> bool:
        return self.retention.due()

    def run(self, guarded: Guarded) -> None:
        self.work(guarded)

    def work(self, guarded: Guarded) -> None:
        guarded("Pruning", self.retention.run)
