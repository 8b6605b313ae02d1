"""Which receivers of a task signal would do anything: the rule by which a send that calls none
is skipped (the enqueue's ``task_enqueued``, the worker's ``task_started`` and
``task_finished``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any

from django.dispatch import Signal

from ..compat import TASKS_LOGGER


def sync_receivers(signal: Signal, sender: Any) -> list[Callable[..., Any]] | None:
    """The receivers of ``signal`` for ``sender``, looked up once; None where some are async or
    they cannot be read (a Django whose internals differ): then every send goes through Django."""
    if not signal.receivers:
        return []
    try:
        sync, asynchronous = signal._live_receivers(sender)
    except Exception:  # pragma: no cover - a Django whose private API changed
        return None
    return None if asynchronous else list(sync)


def acting(
    receivers: list[Callable[..., Any]], loggers: Collection[Callable[..., Any]], level: int
) -> list[Callable[..., Any]]:
    """``receivers`` less ``loggers`` (Django's receivers that only log to TASKS_LOGGER at
    ``level``) while that logger drops ``level``: those would be called to do nothing. Asked per
    batch, so a logger's level changed is seen by the next one."""
    if logging.getLogger(TASKS_LOGGER).isEnabledFor(level):
        return receivers
    return [r for r in receivers if r not in loggers]
