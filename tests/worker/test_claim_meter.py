"""The claim meter: what a worker's claims cost over the last minute, summed up at each
heartbeat and published in its row; time is data here (a clock the test moves)."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
from django.db import connection

from django_sqltasks.models import WorkerRecord
from django_sqltasks.worker import Worker
from django_sqltasks.worker.claim_meter import (
    BASE,
    BUCKETS,
    RATIO,
    SLICE,
    ClaimMeter,
    bucket,
    upper_bound,
)
from tests import tasks
from tests.conftest import set_backend_options, worker_thread
from tests.events import EventLog


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_meter_that_timed_no_claim_knows_no_duration() -> None:
    cost = ClaimMeter(full_passes=False, clock=Clock()).window()
    assert (cost.count, cost.rows) == (0, 0)
    assert (cost.mean, cost.p99, cost.max) == (None, None, None)  # unknown, not 0 ms
    assert cost.full_passes is None  # this database's claims have no full passes
    passes = ClaimMeter(full_passes=True, clock=Clock()).window()
    assert (passes.full_passes, passes.full_pass_max) == (0, None)


def test_the_window_sums_the_last_minute_of_claims() -> None:
    clock = Clock()
    meter = ClaimMeter(full_passes=True, clock=clock)
    durations = [0.001 * (i + 1) for i in range(100)]  # 1 ms to 100 ms
    for i, seconds in enumerate(durations):
        meter.record(seconds, i % 3, full_pass=i in (10, 50))
        clock.now += 0.5  # 50 s of claims
    cost = meter.window()
    assert cost.count == 100 and cost.rows == sum(i % 3 for i in range(100))
    assert cost.mean == pytest.approx(sum(durations) / 100)
    assert cost.max == pytest.approx(0.1)
    true_p99 = sorted(durations)[math.ceil(0.99 * 100) - 1]
    assert cost.p99 is not None and true_p99 <= cost.p99 <= min(true_p99 * RATIO, 0.1)
    assert (cost.full_passes, cost.full_pass_max) == (2, pytest.approx(0.051))
    # A slice at a time, the oldest claims leave the window.
    clock.now += 60 - 50 + SLICE
    later = meter.window()
    assert 0 < later.count < 100 and later.max == pytest.approx(0.1)
    assert later.full_passes == 1  # the one of the first slice left
    clock.now += 60
    gone = meter.window()
    assert (gone.count, gone.mean, gone.max, gone.full_passes) == (0, None, None, 0)


def test_the_p99_is_at_least_the_true_one_and_never_above_the_max() -> None:
    clock = Clock()
    meter = ClaimMeter(full_passes=False, clock=clock)
    for seconds in [0.0003] * 990 + [0.004] * 9 + [0.2]:
        meter.record(seconds, 1)
    cost = meter.window()
    # The 990th shortest is the last of 0.3 ms: the p99 reads it, within a bucket's width.
    assert cost.p99 is not None and 0.0003 <= cost.p99 <= 0.0003 * RATIO
    assert cost.max == pytest.approx(0.2)
    meter = ClaimMeter(full_passes=False, clock=clock)
    meter.record(0.0123, 2)
    assert meter.window().p99 == pytest.approx(0.0123)  # one claim: its own duration


@pytest.mark.parametrize("seconds", [0.0, BASE / 2, BASE, 0.00031, 0.01, 1.0, 1e6])
def test_each_duration_falls_in_the_bucket_that_bounds_it(seconds: float) -> None:
    index = bucket(seconds)
    assert 0 <= index < BUCKETS
    if index not in (0, BUCKETS - 1):
        assert upper_bound(index - 1) < seconds <= upper_bound(index) * (1 + 1e-12)


def test_claims_timed_on_two_threads_while_the_heartbeat_reads_are_all_counted() -> None:
    """The loop's claim and the database thread's record on their own threads; the heartbeat
    reads on a third: the lock keeps every count."""
    meter = ClaimMeter(full_passes=False)
    reads: list[int] = []
    start = threading.Barrier(3)

    def claims() -> None:
        start.wait()
        for _ in range(5000):
            meter.record(0.001, 2)

    def heartbeat() -> None:
        start.wait()
        for _ in range(200):
            reads.append(meter.window().count)

    threads = [threading.Thread(target=f) for f in (claims, claims, heartbeat)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cost = meter.window()
    assert (cost.count, cost.rows) == (10_000, 20_000)
    assert reads == sorted(reads)  # never a count that went back


@pytest.mark.django_db(transaction=True)
def test_a_worker_publishes_what_its_claims_cost_at_its_heartbeat(
    settings: Any, events: EventLog
) -> None:
    """A real worker (on PostgreSQL its claim runs on the event loop, elsewhere on the database
    thread) times its claims and publishes them with its lease: one statement, as before."""
    set_backend_options(settings, HEARTBEAT_INTERVAL=0.2, LEASE_TIMEOUT=5)
    results = [tasks.add.enqueue(i, i) for i in range(5)]
    worker = Worker(queue_names=["*"], concurrency=2, worker_id="metered")
    with worker_thread(worker):
        for result in results:
            events.wait("task_finished", id=str(result.id))
        events.wait("rescue_pass", worker_id="metered", after=events.mark())  # a heartbeat
        row = WorkerRecord.objects.get(id="metered")
    assert row.claim_measured_at == row.heartbeat_at  # by the database's clock, together
    cost = row.claim_cost
    assert cost is not None and cost.count >= 1 and cost.rows == 5
    assert cost.mean is not None and cost.p99 is not None and cost.max is not None
    assert 0 < cost.mean <= cost.max and 0 < cost.p99 <= cost.max
    if connection.vendor == "postgresql":  # the first claim of a worker is a full pass
        assert cost.full_passes is not None and cost.full_passes >= 1
        assert cost.full_pass_max is not None and cost.full_pass_max <= cost.max
    else:
        assert (cost.full_passes, cost.full_pass_max) == (None, None)
