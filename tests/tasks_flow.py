"""Tasks for the flow-control tests: pausing queues, snoozing, running now."""

from __future__ import annotations

from django_sqltasks.compat import task


@task(queue_name="slow")
def slow_queue_noop() -> str:
    return "slow"


@task
def default_queue_noop() -> str:
    return "default"

