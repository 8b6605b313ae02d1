"""Checks on queues: names too long to store, and due tasks no live worker takes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_sqltasks import SQLTaskBackend
from django_sqltasks.models import WorkerRecord
from django_sqltasks.ops import checks
from tests.factories import task_row


def test_queue_name_too_long_is_reported() -> None:
    backend = SQLTaskBackend(
        "custom", {"BACKEND": "django_sqltasks.SQLTaskBackend", "QUEUES": ["q" * 65]}
    )
    assert [m.id for m in backend.check()] == ["django_sqltasks.E004"]


@pytest.mark.django_db
def test_unserved_queue_with_old_due_tasks_warns() -> None:
    old = timezone.now() - timedelta(minutes=10)
    task_row(queue_name="reports", available_at=old)
    task_row(queue_name="default", available_at=old)
    task_row(queue_name="fresh")  # due just now: a worker may be starting
    WorkerRecord.objects.create(id="w1", backend_name="default", queue_names=["default"])
    found = list(checks.check_unserved_queues(databases=["default"]))
    assert [m.id for m in found] == ["django_sqltasks.W001"]
    assert "'reports'" in found[0].msg and "--queue reports" in found[0].hint


@pytest.mark.django_db
def test_a_wildcard_worker_serves_every_queue() -> None:
    task_row(queue_name="reports", available_at=timezone.now() - timedelta(hours=1))
    WorkerRecord.objects.create(id="w1", backend_name="default", queue_names=["*"])
    assert list(checks.check_unserved_queues(databases=["default"])) == []


def test_no_database_no_query() -> None:
    assert list(checks.check_unserved_queues(databases=None)) == []
