"""Whether a worker is making progress: the heartbeat renews the lease only while it is."""

from __future__ import annotations

import threading
import time


class FailingRoles:
    """When each role (claiming, writing outcomes) started failing, if it is failing now.

    Written by the role's own thread (the claim loop, the outcome writer), read by the
    heartbeat thread: every access holds the lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failing_since: dict[str, float] = {}  # role -> monotonic time of its first failure

    def failed(self, role: str) -> None:
        """``role`` could not do its work (the first call of a run of failures counts)."""
        with self._lock:
            self._failing_since.setdefault(role, time.monotonic())

    def succeeded(self, role: str) -> None:
        """``role`` did its work: it is no longer failing."""
        if self._failing_since:  # unlocked read: only a hint, checked again under the lock
            with self._lock:
                self._failing_since.pop(role, None)

    def stalled(self, longer_than: float) -> list[tuple[str, float]]:
        """The roles failing for more than ``longer_than`` seconds, with how long."""
        now = time.monotonic()
        with self._lock:
            return [
                (role, now - since)
                for role, since in self._failing_since.items()
                if now - since > longer_than
            ]
