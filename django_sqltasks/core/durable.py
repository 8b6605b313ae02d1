"""The rules of durable tasks, with no database: what a step, a sleep or an event may be named,
how long a sleep or a wait may last, a step's idempotency key, and the context methods a
``takes_context=True`` task calls (``DurableContext``), which hand over to the step log the
worker gives the attempt (``store/steps.py``). See docs/durable.md.
"""

from __future__ import annotations

import enum
import math
import numbers
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from django.utils import timezone

from ..exceptions import InvalidStep
from .articles import a_or_an
from .columns import MAX_EVENT_KEY_LENGTH, MAX_EVENT_NAME_LENGTH, MAX_STEP_NAME_LENGTH
from .serialization import text_problem

T = TypeVar("T")

# The longest sleep or wait timeout: ten years. A wake time must stay clear of the marks the
# task table keeps in the far future (PARKED, SUSPECT in sql/rows.py).
MAX_SLEEP_SECONDS = 3660 * 86400.0
# Steps, sleeps and waits one task may record: a loop that never ends fails at this count
# instead of filling the step table.
MAX_STEPS_PER_TASK = 10_000


def check_name(value: Any, what: str, most: int = MAX_STEP_NAME_LENGTH) -> str:
    """``value`` if it can name a step or an event (``what`` says which); raise
    ``InvalidStep`` naming the rule."""
    if not isinstance(value, str):
        raise InvalidStep(
            f"{what} must be a string of 1 to {most} characters, not "
            f"{a_or_an(type(value).__name__)}."
        )
    if not 0 < len(value) <= most:
        raise InvalidStep(f"{what} must be 1 to {most} characters long, not {len(value)}.")
    problem = text_problem(value)
    if problem is not None:
        raise InvalidStep(f"{what} {problem}.")
    return value


def check_event(name: Any, key: Any) -> tuple[str, str]:
    """An event's name and key, checked; a key may be given as an int (an order id)."""
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)
    return (
        check_name(name, "The event name", MAX_EVENT_NAME_LENGTH),
        check_name(key, "The event key", MAX_EVENT_KEY_LENGTH),
    )


def check_seconds(value: Any, what: str, *, allow_none: bool = False) -> float | None:
    """``value`` as a finite number of seconds from 0 to MAX_SLEEP_SECONDS; raise
    ``InvalidStep`` naming ``what`` and the rule."""
    if value is None and allow_none:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidStep(f"{what} must be a number of seconds or a timedelta, not {value!r}.")
    seconds = float(value)
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_SLEEP_SECONDS:
        raise InvalidStep(
            f"{what} must be a finite number of seconds from 0 to {MAX_SLEEP_SECONDS:g} "
            f"(ten years), not {value!r}."
        )
    return seconds


def check_until(until: Any, now: datetime) -> datetime:
    """``until``, an aware datetime at most MAX_SLEEP_SECONDS after ``now``; raise
    ``InvalidStep`` naming the rule."""
    if not isinstance(until, datetime):
        raise InvalidStep(f"sleep(until=...) must be a datetime, not {until!r}.")
    if timezone.is_naive(until):
        until = timezone.make_aware(until)
    if until - now > timedelta(seconds=MAX_SLEEP_SECONDS):
        raise InvalidStep(
            f"sleep(until=...) must be at most ten years ahead, not {until.isoformat()}."
        )
    return until


def step_key(task_id: str, name: str, occurrence: int) -> str:
    """The idempotency key of a step: the same on every attempt of the task."""
    return f"{task_id}:{name}" if occurrence == 0 else f"{task_id}:{name}:{occurrence}"


class StepLog(Protocol):
    """What records an attempt's steps (``store/steps.py``)."""

    def step(self, name: str, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any: ...

    async def astep(self, name: str, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any: ...

    def next_key(self, name: str) -> str: ...

    def sleep(self, name: str, seconds: float | None, until: datetime | None) -> None: ...

    async def asleep(self, name: str, seconds: float | None, until: datetime | None) -> None: ...

    def wait_for_event(self, name: str, key: str, timeout: float | None) -> Any: ...

    async def await_event(self, name: str, key: str, timeout: float | None) -> Any: ...

    def add_to_group(self, steps: Sequence[Any]) -> list[str]: ...

    async def aadd_to_group(self, steps: Sequence[Any]) -> list[str]: ...


class DurableContext:
    """The durable methods of a task's context (``SQLTaskContext``)."""

    __slots__ = ()
    steps: StepLog | None  # None: a context made outside a worker, which has no step log

    @property
    def _log(self) -> StepLog:
        if self.steps is None:
            raise InvalidStep("Steps, sleeps and events need a task run by a worker.")
        return self.steps

    def step(self, name: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` as the step ``name`` and store its JSON result; on a
        later attempt of the task, return the stored result without running it."""
        result: T = self._log.step(check_name(name, "A step name"), fn, args, kwargs)
        return result

    async def astep(
        self, name: str, fn: Callable[..., Awaitable[T] | T], /, *args: Any, **kwargs: Any
    ) -> T:
        """Async ``step``: ``fn`` may be an ``async def`` function (awaited) or a sync one."""
        result: T = await self._log.astep(check_name(name, "A step name"), fn, args, kwargs)
        return result

    def step_key(self, name: str) -> str:
        """The idempotency key of the next ``step(name, ...)`` call: hand it to an outside API
        that takes one, so a step run twice is done once there."""
        return self._log.next_key(check_name(name, "A step name"))

    def sleep(
        self,
        seconds: float | timedelta | None = None,
        *,
        until: datetime | None = None,
        name: str = "sleep",
    ) -> None:
        """Stop here and run on from this line after ``seconds`` (or at ``until``), on any
        worker, holding no worker meanwhile. Sleeps are numbered by ``name``, as steps are."""
        self._log.sleep(check_name(name, "A sleep name"), *_sleep_args(seconds, until))

    async def asleep(
        self,
        seconds: float | timedelta | None = None,
        *,
        until: datetime | None = None,
        name: str = "sleep",
    ) -> None:
        """Async ``sleep``."""
        await self._log.asleep(check_name(name, "A sleep name"), *_sleep_args(seconds, until))

    def wait_for_event(
        self, name: str, key: Any, *, timeout: float | timedelta | None = None
    ) -> Any:
        """Return the payload of the event ``name`` with ``key`` (``send_event``), stopping
        here until it comes; raise ``EventTimeout`` if ``timeout`` seconds pass first."""
        name, key = check_event(name, key)
        return self._log.wait_for_event(
            name, key, check_seconds(timeout, "timeout", allow_none=True)
        )

    async def await_event(
        self, name: str, key: Any, *, timeout: float | timedelta | None = None
    ) -> Any:
        """Async ``wait_for_event``."""
        name, key = check_event(name, key)
        return await self._log.await_event(
            name, key, check_seconds(timeout, "timeout", allow_none=True)
        )

    def add_to_group(self, *steps: Any) -> list[str]:
        """Add ``steps`` (tasks, ``task.s(...)`` signatures, chains or groups) to the group
        this task runs in, and start them: the group's callback waits for them too, and gets
        their results after the others'. Done once, as a step: return the new tasks' ids."""
        return self._log.add_to_group(steps)

    async def aadd_to_group(self, *steps: Any) -> list[str]:
        """Async ``add_to_group``."""
        return await self._log.aadd_to_group(steps)


def _sleep_args(seconds: Any, until: Any) -> tuple[float | None, datetime | None]:
    if (seconds is None) == (until is None):
        raise InvalidStep("sleep() takes either a number of seconds or until=, not both or none.")
    if until is not None:
        if not isinstance(until, datetime):
            raise InvalidStep(f"sleep(until=...) must be a datetime, not {until!r}.")
        return None, until
    return check_seconds(seconds, "sleep() seconds"), None


class SentEvent(str, enum.Enum):
    """What ``send_event`` did with an event: true unless it was sent already (the first payload
    stands), as the ``bool`` it returned before."""

    RESUMED = "resumed"  # its waiting task is due now (or, running, takes it at its wait)
    STORED = "stored"  # nobody waits for it yet: the first task to wait for it takes it
    # Its waiter ended (cancelled, failed, deleted) without it: kept for the next task that
    # waits for the key.
    WAITER_GONE = "waiter_gone"
    ALREADY_SENT = "already_sent"  # sent before: nothing changed

    def __bool__(self) -> bool:
        return self is not SentEvent.ALREADY_SENT
