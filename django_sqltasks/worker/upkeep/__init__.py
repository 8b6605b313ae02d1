"""The worker's upkeep, one service per job, as River's ``internal/maintenance/`` and Oban's
plugins: each says what it is called in the log, how often it runs, and what it does; the
heartbeat (``worker/maintenance.py``) runs the services that are due, in order."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")


class Guarded(Protocol):
    """Run ``fn`` on the database thread, riding out transient errors; log any other as
    "``what`` failed" and return None."""

    def __call__(self, what: str, fn: Callable[[], T], /) -> T | None: ...


class Service:
    """One upkeep job of a worker, run by its heartbeat once ``interval`` seconds passed since
    its last run (0: at every heartbeat; every service runs at the first)."""

    def __init__(self, *, interval: float = 0.0) -> None:
        self.interval = interval
        # Owned by the heartbeat thread: when the next run is due (monotonic); 0: at once.
        self._next = 0.0

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def run(self, guarded: Guarded) -> None:
        """Run the job now, and again once its interval passed."""
        self._next = time.monotonic() + self.interval
        self.work(guarded)

    def work(self, guarded: Guarded) -> None:
        """Do the job: its statements through ``guarded``, its reports on this thread."""
        raise NotImplementedError
