"""The liveness probe's file (``tasks_worker --health-file``): touched while the worker (or,
with ``--processes``, every child) makes progress, so a probe that checks its age sees a stuck
worker as stale."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from .. import events

logger = logging.getLogger("django_sqltasks")


def touch(path: str) -> None:
    """Create ``path`` or set its modification time to now; log (never raise) a failure."""
    try:
        with open(path, "a"):
            os.utime(path)
    except OSError as e:
        logger.error("Cannot touch the health file %s: %s", path, e)
    else:
        events.emit("health_touched", path=path)


def toucher(path: str | None) -> Callable[[bool], None] | None:
    """An ``on_beat`` hook that touches ``path`` at each renewed lease (None: no file)."""
    if path is None:
        return None

    def on_beat(renewed: bool) -> None:
        if renewed:
            touch(path)

    return on_beat
