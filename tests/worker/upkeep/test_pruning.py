"""Pruning: the backend's retention deletes the tasks finished before it, keeps the others, and
runs again once its interval passed (at once while more remain: ``Retention``'s own tests)."""

from __future__ import annotations

from datetime import timedelta

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord
from django_sqltasks.store.pruning import Retention
from django_sqltasks.worker.upkeep.pruning import Pruning
from tests.factories import task_row
from tests.worker.upkeep.conftest import Guard


def test_pruning_deletes_what_the_retention_lets_go_then_waits(db: None, guard: Guard) -> None:
    old = task_row(TaskResultStatus.SUCCESSFUL, finished_ago=timedelta(days=10))
    fresh = task_row(TaskResultStatus.SUCCESSFUL, finished_ago=timedelta(hours=1))
    failed = task_row(TaskResultStatus.FAILED, finished_ago=timedelta(days=10))
    retention = Retention(
        backend="default", using="default", successful_days=1, failed_days=None, interval=600
    )
    pruning = Pruning(retention)
    assert pruning.due()
    pruning.run(guard)
    left = set(TaskRecord.objects.values_list("pk", flat=True))
    assert left == {fresh.pk, failed.pk}
    assert old.pk not in left
    assert guard.ran == ["Pruning"]
    assert not pruning.due()  # caught up: back in PRUNE_INTERVAL
