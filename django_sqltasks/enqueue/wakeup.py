"""Waking this process's idle workers when a task is enqueued: the registry, with no thread.

The enqueue side calls ``notify_local``; a worker's ``Wakeup`` (``worker/wakeup.py``, which
owns the threads and the database probes) listens here while it runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

OnWake = Callable[[str | None], None]  # called with the queue name, or None for "anything"

# The workers of this process, by database: changed by their loop threads as they start and
# stop, read by any thread that enqueues; guarded by the lock.
_local_lock = threading.Lock()
_local: dict[str, list[OnWake]] = {}


def notify_local(database: str, queue_name: str) -> None:
    """Wake workers of this process that serve ``database`` (SQLite's enqueue calls this)."""
    with _local_lock:
        listeners = list(_local.get(database, ()))
    for on_wake in listeners:
        on_wake(queue_name)


def has_local_listeners(database: str) -> bool:
    return bool(_local.get(database))  # a hint: a stale answer costs one wake-up, or none


def listen(database: str, on_wake: OnWake) -> None:
    """Called by a worker's wake-up as it starts."""
    with _local_lock:
        _local.setdefault(database, []).append(on_wake)


def unlisten(database: str, on_wake: OnWake) -> None:
    """Called by a worker's wake-up as it stops."""
    with _local_lock:
        listeners = _local.get(database, [])
        if on_wake in listeners:
            listeners.remove(on_wake)
