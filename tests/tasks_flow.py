"""Tasks for the flow-control tests: pausing queues, snoozing, running now."""

from __future__ import annotations

from pathlib import Path

from django_sqltasks import Snooze
from django_sqltasks.compat import task


@task(queue_name="slow")
def slow_queue_noop() -> str:
    return "slow"


@task
def default_queue_noop() -> str:
    return "default"


@task
def snooze_an_hour() -> None:
    raise Snooze(3600)


@task
async def async_snooze_an_hour() -> None:
    raise Snooze(3600)


@task
def snooze_now() -> None:
    raise Snooze(0)


@task
def snooze_once(path: str, seconds: float) -> int:
    """Snooze on the first call; return the number of this call."""
    counter = Path(path)
    calls = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(calls))
    if calls == 1:
        raise Snooze(seconds)
    return calls
