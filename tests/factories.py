"""Build task rows directly, in any state, for tests of the admin and operations."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord


def task_row(
    status: str = TaskResultStatus.READY,
    *,
    task_path: str = "tests.tasks.add",
    queue_name: str = "default",
    finished_ago: timedelta | None = None,
    now: datetime | None = None,
    **fields: Any,
) -> TaskRecord:
    """Create one task row; finished rows get started/finished times ``finished_ago`` back."""
    now = now or timezone.now()
    values: dict[str, Any] = {
        "task_path": task_path,
        "backend_name": "default",
        "queue_name": queue_name,
        "status": status,
        "args": [1, 2],
        "kwargs": {},
    }
    if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED):
        finished_at = now - (finished_ago or timedelta(0))
        values.update(
            attempts=1,
            started_at=finished_at - timedelta(seconds=1),
            last_attempted_at=finished_at - timedelta(seconds=1),
            finished_at=finished_at,
            worker_ids=["w1"],
        )
    if status == TaskResultStatus.FAILED:
        values["errors"] = [
            {"exception_class_path": "builtins.ValueError", "traceback": "Traceback: boom"}
        ]
    if status == TaskResultStatus.SUCCESSFUL:
        values["return_value"] = 3
    if status == TaskResultStatus.RUNNING:
        values.update(attempts=1, started_at=now, last_attempted_at=now, owner="w1")
    values.update(fields)
    return TaskRecord.objects.create(**values)


def staff_client(*permissions: str) -> Client:
    """A client logged in as a staff user holding only these permissions (codenames)."""
    user = User.objects.create_user("staff", "staff@example.com", "pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=permissions))
    client = Client()
    client.force_login(user)
    return client


def superuser_client() -> Client:
    """A client logged in as a superuser."""
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    return client
