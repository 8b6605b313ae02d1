"""Exceptions raised by django-sqltasks."""

from __future__ import annotations

import math
import numbers
from typing import Any

from .compat import InvalidTask

MAX_SNOOZE_SECONDS = 366 * 86400  # the longest snooze: a year, as for periodic schedules


class InvalidTaskArguments(TypeError):
    """A task's arguments or return value cannot be stored as JSON; the message names the value."""


class InvalidReturnValue(InvalidTaskArguments):
    """A task returned a value that cannot be stored as JSON; the message names the value."""


class PayloadTooLarge(InvalidTask):
    """A task's encoded arguments exceed the backend's MAX_PAYLOAD_BYTES option."""


class TaskNotFound(Exception):
    """A stored task path does not import, or names something that is not a Task."""


class WorkerLost(Exception):
    """The worker running a task stopped heartbeating; the task was put back to READY, or
    FAILED once it had been rescued MAX_RESCUES times."""


class WorkerStopped(Exception):
    """The worker was forced to stop while the task ran; the task was put back to READY."""


class TaskCancelled(Exception):
    """The task was cancelled at a user's request: before it started (it never ran), or while
    it ran (async tasks only); either way it is FAILED."""


class TaskTimeout(Exception):
    """An attempt ran past its timeout (the task's ``timeout`` or the backend's TIMEOUT)."""


class CorruptTask(Exception):
    """A stored task row holds JSON that does not parse, or has the wrong shape."""


class OutcomeNotStored(Exception):
    """The database refused a task's outcome (too large, say); the task was marked FAILED."""


class TaskBackendMismatch(TaskNotFound):
    """A stored row names a task declared for another backend; this backend does not run it."""


class Snooze(Exception):
    """Raised inside a task to put it back to READY and run it again after ``seconds``; not a
    failure: no error is recorded and no attempt is spent (see MAX_SNOOZES)."""

    seconds: float  # the delay before the task runs again

    def __init__(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
            raise TypeError(f"Snooze() takes a number of seconds, not {seconds!r}.")
        if not math.isfinite(seconds):
            raise ValueError(f"Snooze() takes a finite number of seconds, not {seconds!r}.")
        if not 0 <= seconds <= MAX_SNOOZE_SECONDS:
            raise ValueError(
                f"Snooze() takes zero or more seconds, at most {MAX_SNOOZE_SECONDS} (366 "
                f"days), not {seconds!r}."
            )
        self.seconds = float(seconds)
        super().__init__(f"Snooze for {self.seconds:g}s")


class SnoozeLimitReached(Exception):
    """A task raised Snooze once more after MAX_SNOOZES snoozes; it failed instead."""


class UnknownQueue(ValueError):
    """A queue name is not one of the backend's QUEUES; the message lists the known ones."""


class InvalidTaskQuery(ValueError):
    """A filter of a ``TaskQuery`` is unknown or breaks its rule; the message names the filter."""


class WorkflowStepSkipped(Exception):
    """A workflow step never ran: a step before it failed; the message names that step."""


class InvalidWorkflow(InvalidTask):
    """A chain or group cannot be enqueued as built; the message says which step and why."""


class WaitTimeout(TimeoutError):
    """A wait for a task to finish (``result.wait(timeout=...)``) ran out first; the task may
    still finish later. ``result`` is its state as last read."""

    def __init__(self, result: Any, timeout: float) -> None:
        self.result = result
        self.timeout = timeout
        super().__init__(
            f"Task {result.id} did not finish within {timeout:g}s (it is {result.status})."
        )
