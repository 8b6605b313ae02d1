"""What the live workers' claims cost, as the overview reads it from their rows: a figure no
fresher than its backend's lease, by the database's clock, or unknown; never 0 ms."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_sqltasks.core.claim_cost import ClaimCost, combine
from django_sqltasks.ops import overview
from django_sqltasks.ops.claims import describe, judged, milliseconds, of_backend
from tests.factories import worker_row

pytestmark = pytest.mark.django_db

FAST = ClaimCost(count=100, rows=250, mean=0.0004, p99=0.002, max=0.003)
SLOW = ClaimCost(count=50, rows=50, mean=0.03, p99=0.09, max=0.12, full_passes=3, full_pass_max=0.1)


def claims_of(worker_id: str) -> ClaimCost | None:
    (found,) = [w for w in overview.live_workers("default") if w.id == worker_id]
    return found.claims


def test_a_fresh_figure_is_read_and_a_stale_or_missing_one_is_unknown() -> None:
    worker_row("fresh", FAST)
    worker_row("old", FAST, measured_ago=timedelta(minutes=2))  # over LEASE_TIMEOUT (30 s)
    # Its lease renewed (by a supervisor) while its own heartbeat, and its figure, stopped.
    worker_row("renewed", SLOW, measured_ago=timedelta(seconds=45))
    worker_row("earlier-version")  # a heartbeat that published nothing
    worker_row("dead", FAST, silent_for=timedelta(hours=1), measured_ago=timedelta(hours=1))
    assert claims_of("fresh") == FAST
    for unknown in ("old", "renewed", "earlier-version", "dead"):
        assert claims_of(unknown) is None, unknown
    assert describe(None) == "unknown (no fresh figure)"


def test_no_claim_in_the_window_is_known_and_its_duration_is_not() -> None:
    worker_row("busy", ClaimCost(count=0, rows=0))
    cost = claims_of("busy")
    assert cost is not None and cost.count == 0 and cost.mean is None
    assert describe(cost) == "no claim in the last minute (duration unknown)"
    assert "0 ms" not in describe(cost) and "0.00 ms" not in describe(cost)


def test_a_backend_s_claims_weigh_each_worker_s_mean_by_its_claims() -> None:
    both = combine([FAST, SLOW])
    assert both is not None
    assert (both.count, both.rows) == (150, 300)
    assert both.mean == pytest.approx((100 * 0.0004 + 50 * 0.03) / 150)
    assert (both.p99, both.max) == (0.09, 0.12)  # the highest: at least the backend's own
    assert (both.full_passes, both.full_pass_max) == (3, 0.1)
    assert combine([]) is None
    claims = of_backend([FAST, None, ClaimCost(count=0, rows=0)])
    assert (claims.reporting, claims.live) == (2, 3)
    assert claims.cost is not None and claims.cost.mean == pytest.approx(0.0004)
    assert of_backend([None, None]).cost is None


def test_what_an_operator_reads() -> None:
    assert [milliseconds(s) for s in (0.00031, 0.0042, 0.038, 1.2041)] == [
        "0.31 ms",
        "4.2 ms",
        "38 ms",
        "1,204 ms",
    ]
    assert describe(SLOW) == (
        "50 in the last minute, mean 30 ms, p99 90 ms, max 120 ms, 1.0 tasks a claim, "
        "3 full pass(es), the slowest 100 ms"
    )


@pytest.mark.parametrize(
    ("mean", "warned", "failed"),
    [(0.004, False, False), (0.006, True, False), (0.06, True, True), (None, False, False)],
)
def test_the_thresholds(mean: float | None, warned: bool, failed: bool) -> None:
    cost = ClaimCost(count=10 if mean else 0, rows=10, mean=mean, p99=mean, max=mean)
    warning, problem = judged("default", of_backend([cost]), 0.005, 0.05)
    assert (warning is not None, problem is not None) == (warned, failed)
    if problem is not None:
        assert "over the 50 ms allowed (--max-claim-mean)" in problem
    unknown = judged("default", of_backend([None]), 0.005, 0.05)
    assert unknown == (None, None)
