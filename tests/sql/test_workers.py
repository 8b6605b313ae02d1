"""The statements on the worker table (``sql/workers.py``): heartbeats and leases, by the
database's clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

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
