"""A task module no test imports by itself: whether a worker imports it is the test."""

from __future__ import annotations

from django_sqltasks.compat import task


@task
def unloaded() -> str:
    return "ran"
