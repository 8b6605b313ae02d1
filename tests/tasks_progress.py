"""Tasks for the progress tests: reports through the context, sync and async."""

from __future__ import annotations

import asyncio
from typing import Any

from django_sqltasks import Snooze
from django_sqltasks.compat import TaskContext, task
from tests import events


@task(takes_context=True)
def report_steps(context: Any, steps: int) -> int:
    for step in range(1, steps + 1):
        context.set_progress(step / steps, f"step {step} of {steps}")
    context.set_metadata(steps=steps, done=True)
    return steps


@task(takes_context=True)
async def async_report(context: Any) -> str:
    context.set_progress(0.5, "half")
    await asyncio.sleep(0)
    context.set_metadata({"pages": 3}, kind="pdf")
    context.set_progress(1.0)
    return context.note


@task(takes_context=True)
def report_then_wait(context: Any, gate: str) -> None:
    """Report, then wait at the test's ``gate`` (the test reads the report meanwhile)."""
    context.set_progress(0.25, "waiting")
    context.set_metadata(stage="wait")
    events.wait_at(gate)
    context.set_progress(0.75, "done waiting")


@task(takes_context=True)
def report_and_fail(context: Any) -> None:
    context.set_progress(0.3, f"attempt {context.attempt}")
    raise ValueError("boom")


@task(takes_context=True)
def report_hostile(context: Any) -> None:
    context.set_progress(0.5, "nul \x00 and lone \udc80 surrogate")
    context.set_metadata({"k\x00": "v\ud800", "big": 2**62, "nested": {"list": ["\x00"]}})


@task(takes_context=True)
def report_bad(context: Any, kind: str) -> None:
    if kind == "nan":
        context.set_progress(float("nan"))
    elif kind == "huge":
        context.set_progress(1e300)
    elif kind == "note":
        context.set_progress(0.5, "x" * 1000)
    elif kind == "metadata":
        context.set_metadata(value=float("inf"))
    elif kind == "big":
        context.set_metadata(big=1e300)


@task(takes_context=True)
def plain_context(context: TaskContext) -> int:
    return context.attempt


@task(takes_context=True)
def report_and_snooze(context: Any) -> None:
    context.set_progress(0.9, "snoozing")
    raise Snooze(3600)
