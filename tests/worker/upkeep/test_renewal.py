"""The lease's renewal: the worker row's heartbeat moves, the watchers are told whether it did,
and a watcher that fails is logged, not raised into the heartbeat."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord, WorkerRecord
from django_sqltasks.worker.lease import Lease
from django_sqltasks.worker.upkeep.renewal import Renewal
from tests.factories import task_row
from tests.worker.upkeep.conftest import WORKER, Guard


def test_a_renewal_moves_the_heartbeat_rescues_and_says_it_renewed(
    lease: Lease, guard: Guard
) -> None:
    renewed = timezone.now() - timedelta(seconds=10)  # time is data: ten seconds ago
    WorkerRecord.objects.filter(id=WORKER).update(heartbeat_at=renewed)
    WorkerRecord.objects.create(id="dead", heartbeat_at=renewed - timedelta(hours=1))
    orphan = task_row(TaskResultStatus.RUNNING, owner="dead", worker_ids=["dead"])
    told: list[bool] = []
    renewal = Renewal(lease, on_beat=told.append)
    renewal.run(guard)
    assert WorkerRecord.objects.get(id=WORKER).heartbeat_at > renewed
    assert TaskRecord.objects.get(pk=orphan.pk).status == TaskResultStatus.READY
    assert (told, guard.ran) == ([True], ["Heartbeat"])
    assert renewal.due()  # at every heartbeat


def test_a_failed_renewal_is_told_and_a_failing_watcher_is_logged(
    lease: Lease, guard: Guard, caplog: pytest.LogCaptureFixture
) -> None:
    told: list[bool] = []
    guard.failing = True
    Renewal(lease, on_beat=told.append).run(guard)
    assert told == [False]

    def broken(renewed: bool) -> None:
        raise RuntimeError("the pipe is closed")

    with caplog.at_level(logging.ERROR, logger="django_sqltasks"):
        Renewal(lease, on_beat=broken).run(guard)
    assert f"Reporting the heartbeat failed worker_id={WORKER}" in caplog.text
