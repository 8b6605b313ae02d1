"""The task the ``scale`` profile enqueues to time the enqueue."""

from __future__ import annotations

from django_sqltasks.compat import task


@task()
def noop(address: str, order: int) -> None:
    """Do nothing: the enqueue is what is timed."""
