"""Paused queues: kept READY by every worker's claim, on every database; the backend's methods,
``manage.py tasks_queue`` and the admin's buttons."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus, task_backends
from django_sqltasks.exceptions import UnknownQueue
from django_sqltasks.models import PausedQueue, TaskRecord
from django_sqltasks.sql import dialect_for
from tests import tasks_flow
from tests.conftest import WorkerProcess
from tests.factories import staff_client, superuser_client, task_row

pytestmark = pytest.mark.django_db

OVERVIEW = "admin:django_sqltasks_queueoverview_changelist"
PAUSE = "admin:django_sqltasks_queueoverview_pause"
RESUME = "admin:django_sqltasks_queueoverview_resume"


def test_pause_resume_and_list_through_the_backend() -> None:
    backend = task_backends["default"]
    assert backend.paused_queues() == []
    assert backend.pause_queue("slow") is True
    assert backend.pause_queue("slow") is False  # paused already
    assert backend.pause_queue("other") is True
    assert backend.paused_queues() == ["other", "slow"]
    assert backend.resume_queue("slow") is True
    assert backend.resume_queue("slow") is False  # not paused
    assert backend.paused_queues() == ["other"]


@pytest.mark.parametrize("name", ["emails", "", 7, "x" * 65])
def test_a_name_outside_queues_is_refused_naming_the_known_ones(name: object) -> None:
    backend = task_backends["default"]
    with pytest.raises(UnknownQueue) as raised:
        backend.pause_queue(name)
    if name == "emails":
        assert "default, other, slow" in str(raised.value)
    assert not PausedQueue.objects.exists()


def due_row(queue_name: str, priority: int = 0) -> None:
    """A READY row due by any database's clock (PostgreSQL's is the transaction's start)."""
    task_row(
        queue_name=queue_name, priority=priority, available_at=timezone.now() - timedelta(minutes=1)
    )


def claim(limit: int, queues: list[str] | None) -> list[str]:
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        rows = dialect.claim(
            cursor, backend_name="default", queue_names=queues, worker_id="w", limit=limit
        )
    return [row.queue_name for row in rows]


@pytest.mark.parametrize("queues", [None, ["default", "slow"], ["slow"]])
def test_the_claim_skips_a_paused_queue_without_blocking_the_others(
    queues: list[str] | None,
) -> None:
    # The paused queue's tasks come first in the claim's order: they must not hold back the rest.
    for _ in range(3):
        due_row("slow", priority=10)
    due_row("default")
    task_backends["default"].pause_queue("slow")
    expected = [] if queues == ["slow"] else ["default"]
    assert claim(1, queues) == expected
    assert TaskRecord.objects.filter(queue_name="slow", status="READY").count() == 3
    task_backends["default"].resume_queue("slow")
    assert claim(5, queues) == ["slow"] * 3


def test_a_pause_of_another_backend_does_not_apply() -> None:
    PausedQueue.objects.create(backend_name="elsewhere", queue_name="slow")
    due_row("slow")
    assert claim(1, None) == ["slow"]


def statuses(results: list[Any]) -> set[str]:
    for result in results:
        result.refresh()
    return {result.status for result in results}


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker_process
def test_two_worker_processes_leave_a_paused_queue_and_run_it_once_resumed(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    def run_two(queue: str) -> None:
        workers = [worker_process("--burst", "--queue", queue) for _ in range(2)]
        for worker in workers:
            assert worker.wait() == 0, worker.output

    backend = task_backends["default"]
    backend.pause_queue("slow")
    paused = [tasks_flow.slow_queue_noop.enqueue() for _ in range(10)]
    running = [tasks_flow.default_queue_noop.enqueue() for _ in range(10)]
    run_two("*")
    assert statuses(running) == {TaskResultStatus.SUCCESSFUL}
    assert statuses(paused) == {TaskResultStatus.READY}
    assert {result.attempts for result in paused} == {0}
    backend.resume_queue("slow")
    run_two("slow")
    assert statuses(paused) == {TaskResultStatus.SUCCESSFUL}


def run_command(*args: str) -> str:
    out = StringIO()
    call_command("tasks_queue", *args, stdout=out)
    return out.getvalue()


def test_the_command_pauses_resumes_and_lists() -> None:
    assert "No queue of backend 'default' is paused" in run_command("list")
    assert "Paused queue 'slow'" in run_command("pause", "slow")
    assert "was paused already" in run_command("pause", "slow")
    assert run_command("list").split() == ["slow"]
    assert "Resumed queue 'slow'" in run_command("resume", "slow")
    assert "was not paused" in run_command("resume", "slow")
    assert not PausedQueue.objects.exists()


def test_the_command_refuses_an_unknown_queue_and_backend() -> None:
    with pytest.raises(CommandError, match="whose QUEUES are: default, other, slow"):
        run_command("pause", "emails")
    with pytest.raises(
        CommandError,
        match=r"--backend: .immediate. is not a django_sqltasks SQLTaskBackend",
    ):
        run_command("--backend", "immediate", "list")
    assert not PausedQueue.objects.exists()


def test_the_overview_pauses_and_resumes_with_the_permission() -> None:
    task_row(queue_name="slow")
    client = superuser_client()
    page = client.get(reverse(OVERVIEW)).content.decode()
    assert reverse(PAUSE) in page and "csrfmiddlewaretoken" in page
    response = client.post(reverse(PAUSE), {"backend": "default", "queue": "slow"}, follow=True)
    assert "Queue &#x27;slow&#x27; paused" in response.content.decode()
    assert task_backends["default"].paused_queues() == ["slow"]
    assert LogEntry.objects.get().change_message == "Queue 'slow' of backend 'default' paused."
    page = client.get(reverse(OVERVIEW)).content.decode()
    assert reverse(RESUME) in page
    client.post(reverse(RESUME), {"backend": "default", "queue": "slow"})
    assert task_backends["default"].paused_queues() == []


def test_the_overview_lists_a_paused_queue_without_tasks() -> None:
    task_backends["default"].pause_queue("other")
    page = superuser_client().get(reverse(OVERVIEW)).content.decode()
    assert 'data-queue="other"' in page and reverse(RESUME) in page


def test_the_overview_refuses_unknown_queues_and_backends() -> None:
    client = superuser_client()
    response = client.post(reverse(PAUSE), {"backend": "default", "queue": "emails"}, follow=True)
    assert "is not a queue of backend" in response.content.decode()
    response = client.post(reverse(PAUSE), {"backend": "nope", "queue": "slow"}, follow=True)
    assert "No SQLTaskBackend is named" in response.content.decode()
    assert not PausedQueue.objects.exists()


def test_pausing_needs_the_permission_and_a_post() -> None:
    viewer = staff_client("view_taskrecord")
    page = viewer.get(reverse(OVERVIEW)).content.decode()
    assert reverse(PAUSE) not in page  # no button without the permission
    assert viewer.post(reverse(PAUSE), {"backend": "default", "queue": "slow"}).status_code == 403
    assert not PausedQueue.objects.exists()
    User.objects.get(username="staff").user_permissions.add(
        Permission.objects.get(codename="pause_queue")
    )
    pauser = viewer
    assert pauser.get(reverse(PAUSE)).status_code == 405
    assert pauser.post(reverse(PAUSE), {"backend": "default", "queue": "slow"}).status_code == 302
    assert PausedQueue.objects.count() == 1


def test_pausing_needs_the_csrf_token() -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    response = client.post(reverse(PAUSE), {"backend": "default", "queue": "slow"})
    assert response.status_code == 403
    assert not PausedQueue.objects.exists()
    page = client.get(reverse(OVERVIEW))
    token = page.cookies["csrftoken"].value
    response = client.post(
        reverse(PAUSE), {"backend": "default", "queue": "slow", "csrfmiddlewaretoken": token}
    )
    assert response.status_code == 302
    assert PausedQueue.objects.count() == 1


def test_a_paused_queue_is_told_apart_in_the_overview_data() -> None:
    from django_sqltasks.ops import overview

    task_row(queue_name="slow", available_at=timezone.now())
    task_backends["default"].pause_queue("slow")
    (stats,) = overview.take(health=False).queues
    assert stats.paused and stats.due == 1
