"""Sending ``task_started`` and ``task_finished`` for a batch of tasks with one look-up of the
receivers, instead of one per task."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.dispatch import Signal

from ..compat import TaskResult, logs_task_started

logger = logging.getLogger("django_sqltasks")

# Receivers that only log (Django's own): they may run on the event loop, which a receiver
# that queries or waits may not.
ON_THE_LOOP = frozenset({logs_task_started})


class Receivers:
    """The receivers of ``signal`` for ``sender``, looked up once and called for many sends.

    ``Signal.send_robust`` looks the receivers up again on every call, which costs more than a
    fast task. A snapshot taken for one claimed batch misses a receiver connected while that
    batch runs; the next batch sees it. Where the receivers cannot be read (async receivers,
    or a Django whose internals differ), every send goes through ``send_robust``.
    """

    __slots__ = ("_sync", "sender", "signal")

    def __init__(self, signal: Signal, sender: Any) -> None:
        self.signal = signal
        self.sender = sender
        self._sync: list[Callable[..., Any]] | None = None
        if not signal.receivers:
            self._sync = []
            return
        try:
            sync, asynchronous = signal._live_receivers(sender)
        except Exception:  # pragma: no cover - a Django whose private API changed
            return
        if not asynchronous:
            self._sync = list(sync)

    @property
    def on_the_loop(self) -> bool:
        """Whether every receiver may run on the event loop (none, or Django's logging one)."""
        return self._sync is not None and all(r in ON_THE_LOOP for r in self._sync)

    def includes(self, receiver: Callable[..., Any]) -> bool:
        """Whether ``receiver`` is among them (False when they could not be read)."""
        return self._sync is not None and receiver in self._sync

    def send(self, **named: Any) -> list[tuple[Any, Any]]:
        """Call every receiver as ``send_robust`` does: an exception is returned, not raised."""
        if self._sync is None:
            return self.signal.send_robust(self.sender, **named)
        responses = []
        for receiver in self._sync:
            try:
                response = receiver(signal=self.signal, sender=self.sender, **named)
            except Exception as e:
                responses.append((receiver, e))
            else:
                responses.append((receiver, response))
        return responses

    def send_for(self, result: TaskResult) -> None:
        """Send the signal for ``result``; log a receiver's error, never raise it."""
        for receiver, response in self.send(task_result=result):
            if isinstance(response, Exception):
                logger.error(
                    "Signal receiver %r failed for task id=%s",
                    receiver,
                    result.id,
                    exc_info=response,
                )
