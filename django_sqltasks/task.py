"""The task nouns: the backend's Task class (Django's Task plus retries, a timeout,
deduplication, limits, a subject) and its result (Django's TaskResult plus progress, subject
and workflow), built from a stored row.

On Django 6.1+ (and the backport) the extra fields come from ``@task(...)`` keyword arguments;
the backend's OPTIONS give the defaults on every version. The rules about those options live
in ``core/policy.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.module_loading import import_string

from .compat import Task, TaskError, TaskResult, TaskResultStatus
from .core import error_text
from .core.progress import NO_METADATA, current_report, no_metadata
from .core.resolve import check_backend, resolve_task
from .core.subject import Subject, subject_of
from .core.tags import normalized_tags
from .core.workflows import Signature
from .exceptions import TaskNotFound


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
    # What waiting tasks are shared out per (a tenant, say): a callable of the task's arguments
    # returning a str, or "subject". Workers take them round robin across keys, within a
    # priority, instead of in arrival order (docs/fair-queues.md).
    fair_key: str | Callable[..., str] | None = None
    # The model row this task's enqueues are about; set by using(subject=obj), never by @task.
    # Left out of equality and hashing: the backend validates a task once, whatever its subject.
    subject: Subject | None = field(default=None, compare=False)
    # True: the task runs in a transaction on the backend's database, and its outcome is
    # stored in that same transaction (docs/workflows.md#atomic-tasks). Sync functions only.
    atomic: bool = False
    # Labels stored with each enqueued task, to find and filter it by in the admin
    # (core/tags.py says the rule). A list given is kept as a tuple: a task must stay hashable.
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "tags", normalized_tags(self.tags))
        Task.__post_init__(self)  # the backend's validation (slots: no zero-argument super())

    def __reduce__(self) -> tuple[Any, ...]:
        # As Django 6.1's Task pickles (by the path of its declaration), on every version: the
        # backport and Django 6.0 pickle the function itself, which its @task name hides.
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["func"] = self.module_path
        return (_rebuild_task, (type(self), fields))

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """Return this task with these arguments, as a step of a chain or group."""
        return Signature(self, args, kwargs)

    def using(self, *, subject: Any = ..., tags: Any = ..., **changes: Any) -> SQLTask:
        """Django's ``Task.using()``, plus ``subject``: a saved model instance the enqueued
        tasks are about (stored with them, see docs/tasks.md), or None for none; and ``tags``,
        the labels stored with them (replacing the task's own)."""
        task: SQLTask = Task.using(self, **changes)  # type: ignore[assignment]
        if tags is not ...:
            task = dataclasses.replace(task, tags=tags)
        if subject is ...:
            return task
        clone: SQLTask = with_subject(task, subject)  # type: ignore[assignment]
        return clone


def _rebuild_task(cls: type[SQLTask], fields: dict[str, Any]) -> SQLTask:
    """Unpickle a task: the function of the task declared at the stored path, with the rest."""
    declared = import_string(fields["func"])
    if not isinstance(declared, Task):
        raise ValueError(f"Expected {fields['func']!r} to point to a Task instance.")
    return cls(**{**fields, "func": declared.func})


def with_subject(task: Task, obj: Any) -> Task:
    """Return a copy of ``task`` whose enqueues are about ``obj`` (None: about nothing)."""
    subject = None if obj is None else subject_of(obj)
    clone = object.__new__(type(task) if isinstance(task, SQLTask) else SQLTask)
    for f in dataclasses.fields(task):
        object.__setattr__(clone, f.name, getattr(task, f.name))
    if not isinstance(task, SQLTask):  # a Django 6.0 Task: our options take their defaults
        for f in dataclasses.fields(SQLTask):
            if not hasattr(task, f.name):
                object.__setattr__(clone, f.name, f.default)
    object.__setattr__(clone, "subject", subject)
    return clone


# Levels of a stored value kept when a row is read; deeper parts are replaced by CUT_MARKER.
# Above serialization.MAX_DEPTH, so no value enqueue accepted is ever cut.
MAX_READ_DEPTH = 100
CUT_MARKER = f"<cut by django-sqltasks: nested deeper than {MAX_READ_DEPTH} levels>"


# Django's TaskResult's fields, in order: the worker's RUNNING result and enqueue's READY one
# are built field by field only while it has exactly these (tests hold both Django versions
# to them), skipping its __post_init__, which walks arguments already checked.
RESULT_FIELDS = (
    "task",
    "id",
    "status",
    "enqueued_at",
    "started_at",
    "finished_at",
    "last_attempted_at",
    "args",
    "kwargs",
    "backend",
    "errors",
    "worker_ids",
    "_return_value",
)
# What a SQLTaskResult adds to Django's TaskResult, copied by refresh() with Django's own.
EXTRA_ATTRS = (
    "progress",
    "progress_note",
    "metadata",
    "progress_updated_at",
    "subject",
    "workflow_id",
)


# django-stubs declare TaskResult without frozen=True, which it is at runtime.
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SQLTaskResult(TaskResult):  # type: ignore[misc]
    """Django's ``TaskResult`` with what this backend also stores: the latest attempt's
    progress report, the task's subject, and the workflow it is a step of."""

    progress: float | None = None  # 0 to 1, as the latest attempt last reported it
    progress_note: str = ""
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=no_metadata)
    progress_updated_at: datetime | None = None
    subject: Subject | None = None  # the model row it was enqueued about
    workflow_id: str | None = None  # the workflow it is a step of (see workflows.get_workflow)

    def refresh(self) -> None:
        """Reload the task's state from the database, this backend's attributes included."""
        self._copy(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        """Async ``refresh``."""
        self._copy(await self.task.get_backend().aget_result(self.id))

    def wait(self, timeout: float | None = None) -> SQLTaskResult:
        """Block until the task is SUCCESSFUL or FAILED, reload it as ``refresh()`` does, and
        return it; raise ``WaitTimeout`` if it has not finished within ``timeout`` seconds
        (None: no limit)."""
        backend: Any = self.task.get_backend()  # an SQLTaskBackend: it made this result
        self._copy(backend.wait_result(self.id, timeout))
        return self

    async def await_result(self, timeout: float | None = None) -> SQLTaskResult:
        """Async ``wait`` (``await`` is a keyword): the wait holds no thread and no
        connection."""
        backend: Any = self.task.get_backend()
        self._copy(await backend.await_result(self.id, timeout))
        return self

    def _copy(self, fresh: TaskResult) -> None:
        names = [f.name for f in dataclasses.fields(TaskResult) if f.name not in ("task", "id")]
        for name in (*names, *EXTRA_ATTRS):
            if hasattr(fresh, name):
                object.__setattr__(self, name, getattr(fresh, name))


def rebind_task(
    task: Task, *, priority: int, queue_name: str, run_after: datetime | None, backend: str
) -> Task:
    """Return a copy of ``task`` with the stored options, without validating it again.

    ``Task.using()`` validates against today's settings; a row enqueued under older settings
    (a queue since removed, say) must still be readable and runnable. ``backend`` is the one the
    row was enqueued through, which must be one that may run the task (``check_backend``); the
    copy names it, so its ``get_backend()`` is the row's.
    """
    check_backend(task, backend)
    stored = (priority, queue_name, run_after, backend)
    if (task.priority, task.queue_name, task.run_after, task.backend) == stored:
        return task
    clone = object.__new__(type(task))
    for f in dataclasses.fields(task):
        object.__setattr__(clone, f.name, getattr(task, f.name))
    object.__setattr__(clone, "priority", priority)
    object.__setattr__(clone, "queue_name", queue_name)
    object.__setattr__(clone, "run_after", run_after)
    object.__setattr__(clone, "backend", backend)
    return clone


def _never_runs(*args: Any, **kwargs: Any) -> None:
    raise TaskNotFound("This stored task's path no longer resolves to a task.")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MissingTask(SQLTask):
    """Stands in for the task of a stored row whose path no longer resolves (renamed or removed
    by a deploy, or refused): the row's result can still be read, never run or enqueued."""

    task_path: str = ""
    reason: str = ""  # why the path does not resolve: the TaskNotFound message

    def __post_init__(self) -> None:
        pass  # nothing to validate against the backend: it is never enqueued

    def __reduce__(self) -> tuple[Any, ...]:
        # Task's own reduce imports module_path again, which is what no longer resolves.
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return (_rebuild_missing_task, (fields,))

    @property
    def module_path(self) -> str:
        return self.task_path

    @property
    def name(self) -> str:
        return self.task_path.rpartition(".")[2]

    def call(self, *args: Any, **kwargs: Any) -> Any:
        raise TaskNotFound(self.reason)

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        raise TaskNotFound(self.reason)

    def enqueue(self, *args: Any, **kwargs: Any) -> Any:
        raise TaskNotFound(self.reason)

    async def aenqueue(self, *args: Any, **kwargs: Any) -> Any:
        raise TaskNotFound(self.reason)


def _rebuild_missing_task(fields: dict[str, Any]) -> MissingTask:
    return MissingTask(**fields)


def missing_task(row: dict[str, Any], reason: str) -> MissingTask:
    """The stand-in task of a row whose task path does not resolve."""
    return MissingTask(
        func=_never_runs,
        priority=row["priority"],
        queue_name=row["queue_name"],
        run_after=row["run_after"],
        backend=row["backend_name"],
        task_path=row["task_path"],
        reason=reason,
    )


def errors_from_json(errors: Any) -> list[TaskError]:
    """A row's errors as Django's ``TaskError``s, whatever shape the column holds."""
    return [
        TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
        for e in error_text.stored_errors(errors)
    ]


def cap_depth(value: Any, levels: int = MAX_READ_DEPTH) -> Any:
    """``value`` with lists and dicts nested deeper than ``levels`` replaced by CUT_MARKER."""
    if isinstance(value, (list, dict)) and levels <= 0:
        return CUT_MARKER
    if isinstance(value, list):
        return [cap_depth(item, levels - 1) for item in value]
    if isinstance(value, dict):
        return {key: cap_depth(item, levels - 1) for key, item in value.items()}
    return value


def result_from_row(row: dict[str, Any], task: Task | None = None) -> TaskResult:
    """Build a complete ``TaskResult`` from a row's decoded column values.

    A row whose task no longer resolves gets a ``MissingTask``; values nested deeper than
    MAX_READ_DEPTH (only a crafted row has them) are cut, since Django's TaskResult walks them
    recursively.
    """
    if task is None:
        try:
            task = resolve_task(row["task_path"], backend=row["backend_name"])
        except TaskNotFound as e:
            task = missing_task(row, str(e))
    task = rebind_task(
        task,
        priority=row["priority"],
        queue_name=row["queue_name"],
        run_after=row["run_after"],
        backend=row["backend_name"],
    )
    values = {"args": row["args"], "kwargs": row["kwargs"]}
    return_value = row["return_value"]
    try:
        result = _result(row, task, values)
    except RecursionError:
        values = {name: cap_depth(value) for name, value in values.items()}
        return_value = cap_depth(return_value)
        result = _result(row, task, values)
    if row["status"] == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", return_value)
    return result


def _result(row: dict[str, Any], task: Task, values: dict[str, Any]) -> TaskResult:
    worker_ids = list(row["worker_ids"])
    report = current_report(row.get("progress"), len(worker_ids))
    subject_type, subject_id = row.get("subject_type"), row.get("subject_id")
    result: TaskResult = SQLTaskResult(
        task=task,
        id=str(row["id"]),
        status=TaskResultStatus(row["status"]),
        enqueued_at=row["enqueued_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        last_attempted_at=row["last_attempted_at"],
        args=values["args"],
        kwargs=values["kwargs"],
        backend=row["backend_name"],
        errors=errors_from_json(row["errors"]),
        worker_ids=worker_ids,
        progress=None if report is None else report.progress,
        progress_note="" if report is None else report.note,
        metadata=NO_METADATA if report is None else report.metadata,
        progress_updated_at=None if report is None else report.updated_at,
        subject=(
            None
            if subject_type is None or subject_id is None
            else Subject(type=subject_type, id=subject_id)
        ),
        workflow_id=None if row.get("workflow_id") is None else str(row["workflow_id"]),
    )
    return result
