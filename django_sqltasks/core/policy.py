"""Rules about one task's options: its retry and timeout policy, the validation of the options
``@task`` adds, and the key a deduplicated call is stored under."""

from __future__ import annotations

import hashlib
import numbers
import random
import sys
from dataclasses import dataclass
from inspect import iscoroutinefunction
from typing import Any

from ..compat import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, InvalidTask, Task
from ..exceptions import SnoozeLimitReached, TaskCancelled
from .bounds import MAX_COUNT, MAX_DELAY, is_count, is_number
from .columns import MAX_DEDUPE_KEY_LENGTH, MAX_NAME_LENGTH, MAX_TASK_PATH_LENGTH
from .limits import call_key, validate_task_limits
from .options import DEFAULT_RETRY_BACKOFF_MAX, BackendOptions
from .resolve import may_run
from .serialization import dumps, text_problem
from .subject import Subject

MAX_DOUBLINGS = 1023  # of the backoff: 2.0 ** 1024 is past the largest float


@dataclass(frozen=True, slots=True)
class Policy:
    """How one task is retried and timed out, with the backend's defaults filled in."""

    max_attempts: int
    retry_on: tuple[type[BaseException], ...]
    backoff: float
    backoff_max: float
    timeout: float | None

    def should_retry(self, attempt: int, exc: BaseException) -> bool:
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


def check_priority_and_queue(task: Task) -> None:
    """Refuse a priority or queue name Django's own checks would meet with a bare error (they
    compare a priority with <, and take True for 1)."""
    priority = task.priority
    if isinstance(priority, bool) or not isinstance(priority, numbers.Integral):
        raise InvalidTask(
            f"priority must be a whole number between {TASK_MIN_PRIORITY} and "
            f"{TASK_MAX_PRIORITY}. Got {priority!r} (a {type(priority).__name__})."
        )
    queue_name = task.queue_name
    if not isinstance(queue_name, str) or not queue_name:
        raise InvalidTask(f"queue_name must be a non-empty string, not {queue_name!r}.")
    problem = text_problem(queue_name)
    if problem is not None:
        raise InvalidTask(f"Queue name {queue_name!r} {problem}.")


def check_queue_known(task: Task, alias: str, queues: set[str]) -> None:
    """Refuse a queue outside the backend's ``QUEUES`` (when it lists any), naming the backend
    and its queues: Django's own error (its first sentence, kept) names neither."""
    if queues and task.queue_name not in queues:
        raise InvalidTask(
            f"Queue {task.queue_name!r} is not valid for backend. TASKS[{alias!r}]['QUEUES'] "
            f"lists {', '.join(map(repr, sorted(queues)))}: add it there, or use one of those."
        )


def validate_options(task: Task, alias: str) -> None:
    """Raise ``InvalidTask`` naming the option and the rule when a task cannot be enqueued
    through backend ``alias``: an extra field is wrong, a name is too long for its column, or
    the task is declared for another backend."""
    declared = getattr(sys.modules.get(task.func.__module__), task.func.__name__, None)
    refusal = may_run(alias, declared.backend) if isinstance(declared, Task) else None
    if isinstance(declared, Task) and refusal is not None:
        # Its row would be refused by this backend's workers (resolve.check_backend).
        raise InvalidTask(
            f"Task {task.module_path} is declared for backend {declared.backend!r}, "
            f"{refusal}, so backend {alias!r} does not run it: enqueue it through "
            f"{declared.backend!r}, or declare it with @task(backend={alias!r})."
        )
    if len(task.module_path) > MAX_TASK_PATH_LENGTH:
        raise InvalidTask(
            f"Task path {task.module_path!r} is longer than {MAX_TASK_PATH_LENGTH} characters."
        )
    if len(task.queue_name) > MAX_NAME_LENGTH:
        raise InvalidTask(
            f"Queue name {task.queue_name!r} is longer than {MAX_NAME_LENGTH} characters."
        )
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
    if subject is not None and not isinstance(subject, Subject):
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
    elif dedupe == "subject":  # "subject:" keeps it apart from a callable's key
        key = "subject:" + call_key(task, "dedupe", dedupe, args, kwargs)
    else:
        key = call_key(task, "dedupe", dedupe, args, kwargs)
    scoped = f"{task.backend}:{task.module_path}:{key}"
    if len(scoped) > MAX_DEDUPE_KEY_LENGTH:
        scoped = "sha256:" + hashlib.sha256(scoped.encode()).hexdigest()
    return scoped
