"""A supervisor's stop: asked by SIGTERM or SIGINT (or by a child that found its id taken),
forced by a second signal or once the shutdown timeout is over, and finished by killing the
children that a forced stop did not end."""

from __future__ import annotations

import logging
import signal
import time

from .child import Children
from .ledger import Ledger

logger = logging.getLogger("django_sqltasks")

FORCE_GRACE = 10.0  # seconds a forced child has to requeue its tasks before SIGKILL


class Stopping:
    """How far the stop of one supervisor's children has gone. Every field is the supervisor
    thread's, but ``signals``, which the signal handler appends to (on that thread too, between
    two of its statements)."""

    def __init__(self, children: Children, ledger: Ledger, shutdown_timeout: float | None) -> None:
        self._children = children
        self._ledger = ledger
        self._shutdown_timeout = shutdown_timeout
        self.signals: list[int] = []  # received, not yet handled
        self.asked_at: float | None = None  # monotonic: when the stop began
        self.forced = False

    @property
    def asked(self) -> bool:
        return self.asked_at is not None

    def on_signal(self, signum: int, _frame: object) -> None:
        """The handler of SIGTERM and SIGINT: handled at the next tick (``handle_signals``)."""
        self.signals.append(signum)

    def ask(self) -> None:
        """Stop every child (SIGTERM: each finishes its running tasks, then exits)."""
        if self.asked_at is None:
            self.asked_at = time.monotonic()
            self._children.signal_all(signal.SIGTERM)

    def handle_signals(self) -> None:
        """Begin the stop on a first signal; force it on a second."""
        while self.signals:
            name = signal.Signals(self.signals.pop(0)).name
            if self.asked_at is None:
                logger.warning(
                    "Received %s: stopping %d worker process(es) (send it again to stop now)",
                    name,
                    len(self._children),
                )
                self.ask()
            elif not self.forced:
                logger.warning("Received %s again: stopping the worker processes now", name)
                self._force()

    def escalate(self) -> None:
        """Force the stop after --shutdown-timeout, and kill children that a forced stop has
        not ended within FORCE_GRACE (one stuck holding the GIL, say)."""
        assert self.asked_at is not None
        now = time.monotonic()
        if (
            not self.forced
            and self._shutdown_timeout is not None
            and now > self.asked_at + self._shutdown_timeout + FORCE_GRACE
        ):
            logger.warning("Worker processes still running after the shutdown timeout")
            self._force()
        for child in self._children.all():
            if child.killed_at is not None and now > child.killed_at + FORCE_GRACE:
                self._children.kill(child)
                self._ledger.requeue(
                    child.worker_id,
                    child.proc.pid,
                    "The worker process was killed while stopping, before this task finished.",
                )

    def _force(self) -> None:
        self.forced = True
        for child in self._children.all():
            child.killed_at = time.monotonic()
        self._children.signal_all(signal.SIGTERM)  # a second one: the child requeues and exits
