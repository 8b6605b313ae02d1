"""The pieces of a limited claim's round (``limited.py``): the groups of tasks it takes, one
claim statement each, and the limit rows it has locked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core.limits import Limit, room


@dataclass(frozen=True, slots=True)
class Group:
    """Tasks one claim statement takes: of ``limit_key`` (None: no task limit) in ``queues``
    (None: every queue of the worker but ``exclude``), under the limits ``gates`` name."""

    limit_key: str | None
    queues: tuple[str, ...] | None
    exclude: tuple[str, ...]
    gates: tuple[str, ...]


class Gate:
    """One locked ``TaskLimit`` row within a claim round."""

    def __init__(self, key: str, limit: Limit, starts: list[float], running: Callable[[], int]):
        self.key = key
        self.limit = limit
        self.starts = starts
        self._running = running
        self._counted: int | None = None
        self.taken = 0

    def room(self, now: float) -> int | None:
        return room(self.limit, self.running, self.starts + [now] * self.taken, now)

    def running(self) -> int:
        if self._counted is None:
            self._counted = self._running()
        return self._counted + self.taken
