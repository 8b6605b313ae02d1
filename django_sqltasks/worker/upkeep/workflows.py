"""Move on the workflows whose steps ended without moving them (cancelled, rescued for the
last time, timed out under a supervisor, salvaged): ``store.workflows.reconcile``."""

from __future__ import annotations

from ...store.workflows import reconcile
from . import Guarded, Service


class WorkflowSweep(Service):
    """Once an ``interval`` (the worker gives its LEASE_TIMEOUT, the time scale of the rescues
    it catches up with): while workflows run, a sweep reads their plans."""

    def __init__(self, *, database: str, backend_name: str, interval: float) -> None:
        super().__init__(interval=interval)
        self.database = database
        self.backend_name = backend_name

    def work(self, guarded: Guarded) -> None:
        guarded("Moving workflows on", self.sweep)

    def sweep(self) -> int:
        return reconcile(self.database, self.backend_name)
