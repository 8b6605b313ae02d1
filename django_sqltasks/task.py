"""The backend's Task class: Django's Task plus retries, a timeout and deduplication.

On Django 6.1+ (and the backport) the extra fields come from ``@task(...)`` keyword arguments;
the backend's OPTIONS give the defaults on every version.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any

from .compat import InvalidTask, Task
from .core.bounds import MAX_COUNT, MAX_DELAY, is_count, is_number
from .core.limits import key_of_call, validate_task_limits
from .core.options import DEFAULT_RETRY_BACKOFF_MAX
from .core.serialization import dumps

if TYPE_CHECKING:
    from .core.options import BackendOptions
    from .core.subject import Subject
    from .core.workflows import Signature

MAX_DEDUPE_KEY_LENGTH = 255  # TaskRecord.dedupe_key
MAX_DOUBLINGS = 1023  # of the backoff: 2.0 ** 1024 is past the largest float


@dataclass(frozen=True, slots=True, kw_only=True)
class SQLTask(Task):
    """A Django Task with the options django-sqltasks understands."""

    # Attempts in all, the first included; None: the backend's MAX_ATTEMPTS.
    max_attempts: int | None = None
    # Exceptions that lead to another attempt; None: any Exception (not SystemExit and such).
    retry_on: tuple[type[BaseException], ...] | None = None
    # Seconds before the first retry, doubling each time; None: the backend's RETRY_BACKOFF.
    retry_backoff: float | None = None
    # Seconds an attempt may run; None: the backend's TIMEOUT (no limit by default).
    timeout: float | None = None
    # True: one live task per (task, arguments); a callable: one per key it returns;
    # "subject": one per subject (see using(subject=...)).
    dedupe: bool | str | Callable[..., str] = False
    # At most this many RUNNING at once, across every worker (per concurrency_key if set).
    concurrency_limit: int | None = None
    # What the concurrency is counted per: a callable of the task's arguments returning a str,
    # or "subject" (see using(subject=...)). Needs concurrency_limit.
    concurrency_key: str | Callable[..., str] | None = None
    # At most N starts in any period, across every worker: "N/s", "N/m" or "N/h".
    rate_limit: str | None = None
    # The model row this task's enqueues are about; set by using(subject=obj), never by @task.
    # Left out of equality and hashing: the backend validates a task once, whatever its subject.
    subject: Subject | None = field(default=None, compare=False)
    # True: the task runs in a transaction on the backend's database, and its outcome is
    # stored in that same transaction (docs/workflows.md#atomic-tasks). Sync functions only.
    atomic: bool = False

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """Return this task with these arguments, as a step of a chain or group."""
        from .core.workflows import Signature

        return Signature(self, args, kwargs)

    def using(self, *, subject: Any = ..., **changes: Any) -> SQLTask:
        """Django's ``Task.using()``, plus ``subject``: a saved model instance the enqueued
        tasks are about (stored with them, see docs/tasks.md), or None for none."""
        task: SQLTask = Task.using(self, **changes)  # type: ignore[assignment]
        if subject is ...:
            return task
        from .core.subject import with_subject

        clone: SQLTask = with_subject(task, subject)  # type: ignore[assignment]
        return clone


@dataclass(frozen=True, slots=True)
class Policy:
    """How one task is retried and timed out, with the backend's defaults filled in."""

    max_attempts: int
    retry_on: tuple[type[BaseException], ...]
    backoff: float
    backoff_max: float
    timeout: float | None

    def should_retry(self, attempt: int, exc: BaseException) -> bool:
        from .exceptions import SnoozeLimitReached, TaskCancelled

        return (
            attempt < self.max_attempts
            and isinstance(exc, self.retry_on)
            and not isinstance(exc, (TaskCancelled, SnoozeLimitReached))
        )

    def delay(self, attempt: int) -> float:
        """Seconds before the attempt after ``attempt``: exponential, capped, half jittered;
        always a number from 0 to MAX_DELAY, whatever the policy holds."""
        # A float power cannot raise (an int one of a large attempt would not fit a float),
        # and a product past the largest float is inf, which the cap takes.
        doubled = self.backoff * 2.0 ** min(max(attempt - 1, 0), MAX_DOUBLINGS)
        delay = min(self.backoff_max, doubled, MAX_DELAY)
        if not 0 <= delay <= MAX_DELAY:  # NaN or negative: a policy built past validation
            delay = DEFAULT_RETRY_BACKOFF_MAX
        return delay / 2 + random.random() * delay / 2


def policy_for(task: Task, config: BackendOptions) -> Policy:
    """The retry and timeout policy of ``task``."""
    max_attempts = getattr(task, "max_attempts", None)
    retry_on = getattr(task, "retry_on", None)
    backoff = getattr(task, "retry_backoff", None)
    timeout = getattr(task, "timeout", None)
    return Policy(
        max_attempts=config.max_attempts if max_attempts is None else max_attempts,
        retry_on=(Exception,) if retry_on is None else tuple(retry_on),
        backoff=config.retry_backoff if backoff is None else backoff,
        backoff_max=config.retry_backoff_max,
        timeout=config.timeout if timeout is None else timeout,
    )


def validate_options(task: Task) -> None:
    """Raise ``InvalidTask`` naming the option and the rule when an extra field is wrong."""
    max_attempts = getattr(task, "max_attempts", None)
    if max_attempts is not None and not is_count(max_attempts, 1):
        raise InvalidTask(
            f"max_attempts must be a whole number of at least 1, at most {MAX_COUNT:,}, not "
            f"{max_attempts!r}."
        )
    retry_on = getattr(task, "retry_on", None)
    if retry_on is not None and not (
        isinstance(retry_on, tuple)
        and all(isinstance(e, type) and issubclass(e, BaseException) for e in retry_on)
    ):
        raise InvalidTask(f"retry_on must be a tuple of exception classes, not {retry_on!r}.")
    for name in ("retry_backoff", "timeout"):
        value = getattr(task, name, None)
        if value is not None and not is_number(value, 0, MAX_DELAY, above=name == "timeout"):
            rule = "a positive" if name == "timeout" else "a non-negative"
            raise InvalidTask(
                f"{name} must be {rule} number of seconds, at most {MAX_DELAY:g} (366 days), "
                f"not {value!r}."
            )
    subject = getattr(task, "subject", None)
    if subject is not None:
        from .core.subject import Subject

        if not isinstance(subject, Subject):
            raise InvalidTask(
                f"subject is set per enqueue with .using(subject=obj), not by @task: {subject!r}."
            )
    validate_task_limits(task)
    atomic = getattr(task, "atomic", False)
    if not isinstance(atomic, bool):
        raise InvalidTask(f"atomic must be True or False, not {atomic!r}.")
    if atomic and iscoroutinefunction(task.func):
        raise InvalidTask(
            f"atomic=True needs a sync function: {task.module_path} is async, and a database "
            "transaction cannot span its awaits."
        )
    dedupe = getattr(task, "dedupe", False)
    if not isinstance(dedupe, bool) and not callable(dedupe) and dedupe != "subject":
        raise InvalidTask(f"dedupe must be True, False, 'subject' or a callable, not {dedupe!r}.")


def dedupe_key(task: Task, args: list[Any], kwargs: dict[str, Any]) -> str | None:
    """The deduplication key of a call, or None when the task does not deduplicate.

    Keys are scoped to the backend alias and the task path, so equal arguments to different
    tasks never collide; a key too long for the column is replaced by its SHA-256.
    """
    dedupe = getattr(task, "dedupe", False)
    if dedupe is False:
        return None
    if dedupe is True:
        key = hashlib.sha256(dumps([args, kwargs]).encode()).hexdigest()
    elif dedupe == "subject":
        subject = getattr(task, "subject", None)
        if subject is None:
            raise InvalidTask(
                f"{task.module_path} deduplicates by subject (dedupe='subject'): enqueue it "
                "with .using(subject=obj)."
            )
        key = f"subject:{subject}"
    else:
        key = key_of_call(task, "dedupe", dedupe, args, kwargs)
    scoped = f"{task.backend}:{task.module_path}:{key}"
    if len(scoped) > MAX_DEDUPE_KEY_LENGTH:
        scoped = "sha256:" + hashlib.sha256(scoped.encode()).hexdigest()
    return scoped
