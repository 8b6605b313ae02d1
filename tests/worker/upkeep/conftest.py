"""What the heartbeat gives each upkeep service: a guard that runs a statement here (on the
test's connection, in its transaction) and says what ran, or, told to, fails as a database
error does in a worker (logged, and None returned)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from django_sqltasks.worker.lease import Lease
from django_sqltasks.worker.upkeep import Service
from tests.factories import worker_lease

T = TypeVar("T")
WORKER = "upkeep-worker"


class Guard:
    """A ``Guarded`` on the test's thread: it records each job's name, in order."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.failing = False  # each job fails, as on a lost database: logged, None

    def __call__(self, what: str, fn: Callable[[], T], /) -> T | None:
        self.ran.append(what)
        if self.failing:
            return None
        return fn()


@pytest.fixture
def guard() -> Guard:
    return Guard()


@pytest.fixture
def lease(db: Any) -> Lease:
    lease = worker_lease(WORKER)
    lease.register()
    return lease


def later(service: Service, seconds: float) -> None:
    """Move ``service``'s clock: its next run as if ``seconds`` had passed (time is data)."""
    service._next -= seconds
