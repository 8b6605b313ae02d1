"""Cancel requests: the ids of this worker's running tasks asked to stop go to the worker, and
nothing is said when none is asked."""

from __future__ import annotations

import uuid

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.worker.lease import Lease
from django_sqltasks.worker.upkeep.cancels import CancelRequests
from tests.factories import task_row
from tests.worker.upkeep.conftest import WORKER, Guard


def test_the_running_tasks_asked_to_stop_go_to_the_worker(lease: Lease, guard: Guard) -> None:
    asked = task_row(TaskResultStatus.RUNNING, owner=WORKER, cancel_requested=True)
    task_row(TaskResultStatus.RUNNING, owner=WORKER)  # not asked
    task_row(TaskResultStatus.RUNNING, owner="another", cancel_requested=True)  # not ours
    told: list[list[uuid.UUID]] = []
    cancels = CancelRequests(lease, told.append)
    cancels.run(guard)
    assert told == [[asked.pk]]
    assert guard.ran == ["Reading cancel requests"]
    assert cancels.due()  # at every heartbeat


def test_no_request_tells_the_worker_nothing(lease: Lease, guard: Guard) -> None:
    told: list[list[uuid.UUID]] = []
    task_row(TaskResultStatus.RUNNING, owner=WORKER)
    CancelRequests(lease, told.append).run(guard)
    guard.failing = True
    CancelRequests(lease, told.append).run(guard)
    assert told == []
