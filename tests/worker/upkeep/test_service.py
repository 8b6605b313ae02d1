"""A service runs at the first heartbeat, then once its interval passed (0: at every one)."""

from __future__ import annotations

from django_sqltasks.worker.upkeep import Guarded, Service
from tests.worker.upkeep.conftest import Guard, later


class Counting(Service):
    def __init__(self, interval: float) -> None:
        super().__init__(interval=interval)
        self.runs = 0

    def work(self, guarded: Guarded) -> None:
        guarded("Counting", lambda: None)
        self.runs += 1


def test_a_service_is_due_at_once_then_once_its_interval_passed(guard: Guard) -> None:
    hourly = Counting(3600)
    assert hourly.due()
    hourly.run(guard)
    assert not hourly.due()
    later(hourly, 3599)
    assert not hourly.due()
    later(hourly, 2)
    assert hourly.due()
    assert (hourly.runs, guard.ran) == (1, ["Counting"])


def test_a_service_without_an_interval_runs_at_every_heartbeat(guard: Guard) -> None:
    each = Counting(0)
    for _ in range(3):
        assert each.due()
        each.run(guard)
    assert each.runs == 3
