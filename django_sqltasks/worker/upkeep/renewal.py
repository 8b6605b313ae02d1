"""Renew the worker's lease and rescue the tasks of workers whose lease ran out, at every
heartbeat; then tell the worker's watchers (a liveness file, the supervisor) and write the
running tasks' progress."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..lease import Lease
from ..reporter import Reporter
from . import Guarded, Service

logger = logging.getLogger("django_sqltasks")


class Renewal(Service):
    """The lease's renewal and the rescue of dead workers' tasks (``Lease.heartbeat``)."""

    def __init__(
        self,
        lease: Lease,
        *,
        on_beat: Callable[[bool], None] | None = None,
        reporter: Reporter | None = None,
    ) -> None:
        super().__init__()
        self.lease = lease
        # Told at the start and at each heartbeat whether the lease was renewed (a liveness
        # probe's file, the supervisor's pipe); called on the heartbeat thread.
        self._on_beat = on_beat
        self._reporter = reporter  # running tasks' progress, written at each heartbeat

    def work(self, guarded: Guarded) -> None:
        self.report(guarded("Heartbeat", self._renew) is not None)
        if self._reporter is not None:
            self._reporter.flush_soon()

    def _renew(self) -> bool:
        self.lease.heartbeat()
        return True

    def report(self, renewed: bool) -> None:
        """Tell ``on_beat`` whether the lease was renewed; a failure to tell is logged."""
        if self._on_beat is None:
            return
        try:
            self._on_beat(renewed)
        except Exception:
            logger.exception("Reporting the heartbeat failed worker_id=%s", self.lease.worker_id)
