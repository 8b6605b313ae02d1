"""Sending ``task_started`` and ``task_finished`` for a batch of tasks with one look-up of the
receivers, instead of one per task."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.dispatch import Signal

from ..compat import TaskResult, TaskResultStatus, logs_task_finished, logs_task_started
from ..core.receivers import acting, sync_receivers

logger = logging.getLogger("django_sqltasks")

# Receivers that only log (Django's own): they may run on the event loop, which a receiver
# that queries or waits may not.
ON_THE_LOOP = frozenset({logs_task_started})
# Django's receivers that do nothing but log a result to TASKS_LOGGER, at INFO (a finish that
# FAILED at ERROR). Where that logger drops INFO (as tasks_worker sets it without DEBUG or -v 2),
# calling them for a result that did not fail does nothing: they are left out of those sends.
LOGS_AT_INFO = frozenset({logs_task_started, logs_task_finished})


class Receivers:
    """The receivers of ``signal`` for ``sender``, looked up once and called for many sends.

    ``Signal.send_robust`` looks the receivers up again on every call, which costs more than a
    fast task. A snapshot taken for one claimed batch misses a receiver connected while that
    batch runs; the next batch sees it. Where the receivers cannot be read (async receivers,
    or a Django whose internals differ), every send goes through ``send_robust``.
    """

    __slots__ = ("_acting", "_sync", "sender", "signal")

    def __init__(self, signal: Signal, sender: Any) -> None:
        self.signal = signal
        self.sender = sender
        self._sync = sync_receivers(signal, sender)
        # The receivers that do something for a result that did not fail (see LOGS_AT_INFO).
        self._acting = (
            None if self._sync is None else acting(self._sync, LOGS_AT_INFO, logging.INFO)
        )

    @property
    def idle(self) -> bool:
        """Whether sending for results that did not fail calls no receiver at all."""
        return self._acting is not None and not self._acting

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
        return self._call(self._sync, **named)

    def _call(self, receivers: list[Callable[..., Any]], **named: Any) -> list[tuple[Any, Any]]:
        responses = []
        for receiver in receivers:
            try:
                response = receiver(signal=self.signal, sender=self.sender, **named)
            except Exception as e:
                responses.append((receiver, e))
            else:
                responses.append((receiver, response))
        return responses

    def send_for(self, result: TaskResult) -> None:
        """Send the signal for ``result``; log a receiver's error, never raise it."""
        if self._acting is not None and result.status != TaskResultStatus.FAILED:
            if not self._acting:
                return
            responses = self._call(self._acting, task_result=result)
        else:
            responses = self.send(task_result=result)
        for receiver, response in responses:
            if isinstance(response, Exception):
                logger.error(
                    "Signal receiver %r failed for task id=%s",
                    receiver,
                    result.id,
                    exc_info=response,
                )
