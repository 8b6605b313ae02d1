"""Tasks of the durable task tests (tests/test_durable*.py): each step appends a line to a log
file, so a test counts how many times each step's side effect happened."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import transaction

from django_sqltasks import EventTimeout, group, send_event
from django_sqltasks.compat import task
from django_sqltasks.core.durable import SentEvent
from tests import events, tasks_workflows
from tests.lost_connections import lost_at


def _effect(log: str, line: str) -> str:
    with Path(log).open("a") as f:
        f.write(line + "\n")
    return line


def effects(log: str | Path) -> list[str]:
    """The side effects the steps had, in order."""
    path = Path(log)
    return path.read_text().split() if path.exists() else []


def _kill_once(marker: str) -> None:
    """SIGKILL this process the first time only (``marker`` remembers it)."""
    if not os.path.exists(marker):
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)


@task(takes_context=True, max_attempts=3, retry_backoff=0)
def three_steps(context: Any, log: str, kill_at: str = "", marker: str = "") -> list[str]:
    """Three steps; ``kill_at`` ("before:2", "during:1", "record:3", "after:1") kills the
    worker there, on the first run."""
    point, _, number = kill_at.partition(":")
    results = []
    for i in (1, 2, 3):
        here = str(i) == number

        def effect(i: int = i, here: bool = here) -> str:
            line = _effect(log, f"step{i}")
            if here and point == "during":
                _kill_once(marker)
            return line

        if here and point == "before":
            _kill_once(marker)
        if here and point == "record":
            with transaction.atomic():
                results.append(context.step(f"step{i}", effect))
                _kill_once(marker)
        else:
            results.append(context.step(f"step{i}", effect))
        if here and point == "after":
            _kill_once(marker)
    return results


@task(takes_context=True, max_attempts=3, retry_backoff=0)
def fails_at_third(context: Any, log: str, marker: str) -> list[Any]:
    """Two steps, then a third that raises on the first attempt."""
    first = context.step("one", _effect, log, "one")
    key = context.step_key("two")
    second = context.step("two", lambda: {"key": key, "line": _effect(log, "two")})

    def third() -> str:
        _effect(log, "three")
        if not os.path.exists(marker):
            Path(marker).touch()
            raise ValueError("the third step failed on purpose")
        return "three"

    return [first, second, context.step("three", third)]


@task(takes_context=True)
def repeated(context: Any, log: str, count: int) -> list[int]:
    """The same step name in a loop: each occurrence is its own step."""
    return [context.step("row", _effect, log, f"row{i}") and i for i in range(count)]


@task(takes_context=True)
def sleeper(context: Any, log: str, seconds: float) -> str:
    context.step("before", _effect, log, "before")
    context.sleep(seconds)
    events.note("woke")
    context.step("after", _effect, log, "after")
    return "slept"


@task(takes_context=True)
def sleeps_until(context: Any, until: str) -> str:
    context.sleep(until=datetime.fromisoformat(until))
    return "woke"


@task(takes_context=True)
def sleeps_nan(context: Any) -> str:
    context.sleep(math.nan)
    return "woke"


@task(takes_context=True)
def waiter(context: Any, log: str, name: str, key: str, timeout: float | None = None) -> Any:
    events.note("started", key=key)
    context.step("before", _effect, log, "before")
    try:
        payload = context.wait_for_event(name, key, timeout=timeout)
    except EventTimeout as e:
        payload = {"timed_out": e.key}
    events.note("resumed", key=key)
    context.step("after", _effect, log, f"after:{key}")
    return payload


@task(takes_context=True)
def waits_in_transaction(context: Any) -> Any:
    with transaction.atomic():
        return context.wait_for_event("order.paid", "1")


@task(takes_context=True)
def returns(context: Any, kind: str) -> Any:
    """A step returning something that cannot be stored."""
    values: dict[str, Any] = {
        "object": object(),
        "nan": math.nan,
        "large": "x" * (100 * 1024 * 1024),
    }
    return context.step("bad", lambda: values[kind])


@task(takes_context=True)
def named(context: Any, name: str) -> Any:
    return context.step(name, lambda: 1)


@task(takes_context=True)
def waits_for_key(context: Any, key: str) -> Any:
    return context.wait_for_event("order.paid", key)


@task
def plain(value: int) -> int:
    return value


@task
def forgets_context(context: Any = None) -> int:
    """Written for a context, declared without takes_context."""
    return int(context.step("one", int, 1))


@task
def forgets_context_for(context: Any, order_id: int) -> int:
    return int(context.step("order", int, order_id))


@task
def noted(key: str) -> None:
    """Tell the test it started: the baseline of the wake-up latency."""
    events.note("started", key=key)


@task(takes_context=True)
async def async_flow(context: Any, log: str, key: str) -> Any:
    async def charge() -> str:
        return _effect(log, "charge")

    first = await context.astep("charge", charge)
    second = await context.astep("sync", _effect, log, "sync")
    await context.asleep(0)
    payload = await context.await_event("order.paid", key, timeout=3600)
    return [first, second, payload]


@task(takes_context=True)
def timed_steps(context: Any, count: int) -> list[float]:
    """``count`` steps of a function that does nothing: the CPU (this thread's) and wall time
    of one step, in microseconds, and of one plain call of the function."""

    def nothing() -> int:
        return 1

    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(count):
        context.step("s", nothing)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    plain = time.perf_counter()
    for _ in range(count):
        nothing()
    plain = time.perf_counter() - plain
    return [cpu / count * 1e6, wall / count * 1e6, plain / count * 1e6]


@task(takes_context=True, max_attempts=2, retry_backoff=0)
def splits(context: Any, pages: int, marker: str = "") -> int:
    """A member of a group that adds one member per further page (an open batch); fails once
    after the add when ``marker`` is given, to show the add is not made twice."""
    context.add_to_group(*[count_page.s(page) for page in range(2, pages + 1)])
    if marker and not os.path.exists(marker):
        Path(marker).touch()
        raise ValueError("failed after the add, on purpose")
    return 1


@task
def count_page(page: int) -> int:
    return page


@task(takes_context=True)
def adds_alone(context: Any) -> Any:
    return context.add_to_group(count_page.s(1))


def _hostile(kind: str) -> Any:
    """Values no test can pass as a task's argument (enqueue refuses them): built here."""
    return {
        "surrogate": "a\ud800b",
        "nul": "a\x00b",
        "10kb": "n" * 10_240,
        "huge_int": 2**64,
        "1e300": 1e300,
        "-1": -1,
        "inf": math.inf,
        "nan": math.nan,
        "-1 day": timedelta(days=-1),
        "naive 9999": datetime(9999, 12, 31),
        "not a time": "tomorrow",
    }[kind]


@task(takes_context=True)
def hostile(context: Any, call: str, kind: str) -> Any:
    """One durable call (``call``) given a hostile value (``kind``, see ``_hostile``)."""
    value = _hostile(kind)
    if call == "step name":
        return context.step(value, lambda: 1)
    if call == "step result":
        return context.step("bad", lambda: value)
    if call == "sleep":
        return context.sleep(value)
    if call == "sleep until":
        return context.sleep(until=value)
    if call == "sleep name":
        return context.sleep(0, name=value)
    if call == "timeout":
        return context.wait_for_event("order.paid", "1", timeout=value)
    if call == "event name":
        return context.wait_for_event(value, "1")
    if call == "event key":
        return context.wait_for_event("order.paid", value)
    raise AssertionError(call)


@task(takes_context=True, max_attempts=1)
def loses_connection(context: Any, log: str, stage: str, when: str, gate: str = "") -> int:
    """A step, a sleep, a wait for event ("lost", ``stage``) and, as a group's member, an add
    to its group; the connection lost at ``stage``'s statement (see tests/lost_connections)."""

    def at(here: str) -> contextlib.AbstractContextManager[None]:
        return lost_at(here, when, gate=gate) if here == stage else contextlib.nullcontext()

    with at("step"):
        context.step("one", _effect, log, f"one:{stage}")
    with at("park"):
        context.sleep(0.01)
    with at("event"):
        context.wait_for_event("lost", stage)
    if stage == "group":
        with at("group"):
            context.add_to_group(count_page.s(2))
    context.step("two", _effect, log, f"two:{stage}")
    return 1


def enqueue_losing(log: str, stage: str, when: str, gate: str = "") -> Any:
    """``loses_connection`` at ``stage``, its event sent already; as a member of a group (with
    ``count_page(10)``, then ``sum_of``) for "group". The workflow for "group", else the
    task's result."""
    assert send_event("lost", stage, {"stage": stage}) == SentEvent.STORED
    call = loses_connection
    if stage == "group":
        return (
            group(call.s(log, stage, when, gate), count_page.s(10))
            .then(tasks_workflows.sum_of.s())
            .enqueue()
        )
    return call.enqueue(log, stage, when, gate)


@task(takes_context=True)
def one_step(context: Any) -> int:
    """One step of a function that does nothing (scripts/pool_figures.py: a durable task's
    own cost to its worker)."""
    return int(context.step("one", int, 1))
