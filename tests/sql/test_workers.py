"""The statements on the worker table (``sql/workers.py``): heartbeats and leases, by the
database's clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_sqltasks.core.claim_cost import ClaimCost
from django_sqltasks.models import WorkerRecord
from django_sqltasks.sql.dialect import Dialect


@pytest.mark.django_db
def test_live_workers_like_matches_the_prefix_literally(dialect: Dialect) -> None:
    for worker_id in ("web-1", "web-2", "web_x-1", "webs-1", "stale-1"):
        WorkerRecord.objects.create(id=worker_id, backend_name="default", pid=1)
    WorkerRecord.objects.filter(id="stale-1").update(
        heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    with connection.cursor() as cursor:
        for worker_id in ("web-1", "web-2", "web_x-1", "webs-1", "stale-1"):
            dialect.heartbeat(cursor, worker_id) if worker_id != "stale-1" else None
        assert sorted(r[0] for r in dialect.live_workers_like(cursor, "web-", 30)) == [
            "web-1",
            "web-2",
        ]
        assert [r[0] for r in dialect.live_workers_like(cursor, "web_", 30)] == ["web_x-1"]
        assert dialect.live_workers_like(cursor, "stale-", 30) == []


@pytest.mark.django_db
def test_the_database_clock_and_the_worker_table(dialect: Dialect) -> None:
    from django_sqltasks.models import WorkerRecord

    before = timezone.now()
    with connection.cursor() as cursor:
        now = dialect.db_now(cursor)
    assert now.tzinfo is not None and abs((now - before).total_seconds()) < 5
    WorkerRecord.objects.create(id="alive", backend_name="default", pid=11, hostname="here")
    WorkerRecord.objects.create(
        id="silent", backend_name="default", heartbeat_at=before - timedelta(minutes=10)
    )
    with connection.cursor() as cursor:
        assert dialect.heartbeat(cursor, "alive")
        assert not dialect.heartbeat(cursor, "nobody")
        assert dialect.live_worker(cursor, "alive", lease_timeout=30) == (11, "here", "")
        assert dialect.live_worker(cursor, "silent", lease_timeout=30) is None
        assert dialect.forget_dead_workers(cursor, lease_timeout=30) == 1
    assert set(WorkerRecord.objects.values_list("id", flat=True)) == {"alive"}
    assert WorkerRecord.objects.get(id="alive").heartbeat_at >= before - timedelta(seconds=5)


@pytest.mark.django_db
def test_a_heartbeat_publishes_the_claims_cost_and_a_renewal_leaves_it(dialect: Dialect) -> None:
    """The worker's heartbeat writes its claims' cost beside its lease, in the same statement,
    by the database's clock; a renewal without it (a supervisor renewing its child's lease)
    leaves the figure and its time as they were, so a reader can tell it is getting old."""
    WorkerRecord.objects.create(id="w", backend_name="default")
    cost = ClaimCost(
        count=120, rows=300, mean=0.0003, p99=0.0012, max=0.004, full_passes=2, full_pass_max=0.002
    )
    with connection.cursor() as cursor:
        before = dialect.db_now(cursor)
    with CaptureQueriesContext(connection) as statements, connection.cursor() as cursor:
        assert dialect.heartbeat(cursor, "w", cost)
    assert len(statements) == 1  # as a heartbeat without it: the figure rides along
    row = WorkerRecord.objects.get(id="w")
    assert row.claim_cost == cost
    assert row.claim_measured_at == row.heartbeat_at
    assert row.heartbeat_at >= before - timedelta(seconds=1)
    idle = ClaimCost(count=0, rows=0)  # no claim in the window: no duration is known
    with connection.cursor() as cursor:
        assert dialect.heartbeat(cursor, "w", idle)
    assert WorkerRecord.objects.get(id="w").claim_cost == idle
    stale = row.heartbeat_at - timedelta(minutes=5)
    WorkerRecord.objects.filter(id="w").update(heartbeat_at=stale, claim_measured_at=stale)
    with connection.cursor() as cursor:
        assert dialect.heartbeat(cursor, "w")  # a renewal: the lease only
        assert not dialect.heartbeat(cursor, "gone", cost)
    renewed = WorkerRecord.objects.get(id="w")
    assert renewed.heartbeat_at > stale and renewed.claim_measured_at == stale
    assert renewed.claim_cost == idle
