"""Exceptions raised by django-sqltasks."""

from __future__ import annotations

from .compat import InvalidTask


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


class UnknownQueue(ValueError):
    """A queue name is not one of the backend's QUEUES; the message lists the known ones."""
