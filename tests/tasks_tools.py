"""Tasks the tests of django_sqltasks.testing, tasks_check and subjects enqueue."""

from __future__ import annotations

import time

from django.contrib.auth.models import User

from django_sqltasks.compat import task


@task
def username(user_id: int) -> str:
    """Read a row the test made inside its transaction."""
    return User.objects.get(pk=user_id).username


@task
def parent(child_args: list[int]) -> str:
    """Enqueue a child task; run_tasks() runs it too."""
    add_one.enqueue(*child_args)
    return "parent"


@task
def add_one(value: int) -> int:
    return value + 1


@task
def forever(n: int) -> None:
    """Enqueue itself again: a runaway."""
    forever.enqueue(n + 1)


@task(max_attempts=3, retry_backoff=60)
def fails_with_backoff() -> None:
    raise ConnectionError("down")


@task(timeout=0.05)
def overruns_and_raises() -> None:
    time.sleep(0.2)
    raise ValueError("after the timeout")


@task(dedupe="subject")
def reindex(reason: str = "") -> str:
    """One live task per subject, whatever its arguments."""
    return reason
