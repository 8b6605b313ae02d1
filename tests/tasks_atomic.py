"""Atomic tasks that real worker processes run (tests/worker/test_atomic.py)."""

from __future__ import annotations

import time

from django.contrib.auth.models import Group

from django_sqltasks.compat import task


@task(atomic=True)
def rename(pk: int, name: str, seconds: float = 0.0) -> str:
    """The pattern of docs/workflows.md: lock the task's own row, then write it (reading first,
    so that another transaction may write in between)."""
    row = Group.objects.select_for_update().get(pk=pk)
    time.sleep(seconds)
    row.name = name
    row.save()
    return name


@task(atomic=True, timeout=1)
def rename_past_timeout(pk: int, name: str, seconds: float) -> str:
    """Write the task's row, then run ``seconds`` past the write (longer than the timeout)."""
    Group.objects.filter(pk=pk).update(name=name)
    time.sleep(seconds)
    return name
