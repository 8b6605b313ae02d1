"""Turning stored rows into Django Tasks ``TaskResult`` objects, and tasks into dotted paths."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from functools import lru_cache
from typing import Any

from django.utils.module_loading import import_string

from .compat import Task, TaskError, TaskResult, TaskResultStatus
from .exceptions import TaskNotFound


@lru_cache(maxsize=1024)
def resolve_task(task_path: str) -> Task:
    """Import ``task_path`` and check that it names a ``Task``; raise ``TaskNotFound`` if not."""
    try:
        obj = import_string(task_path)
    except ImportError as e:
        raise TaskNotFound(f"Task path {task_path!r} does not import: {e}") from e
    if not isinstance(obj, Task):
        raise TaskNotFound(
            f"Task path {task_path!r} names a {type(obj).__name__}, not a Task: only functions "
            "decorated with @task can be run."
        )
    return obj


def rebind_task(
    task: Task, *, priority: int, queue_name: str, run_after: datetime | None, backend: str
) -> Task:
    """Return a copy of ``task`` with the stored options, without validating it again.

    ``Task.using()`` validates against today's settings; a row enqueued under older settings
    (a queue since removed, say) must still be readable and runnable.
    """
    if (task.priority, task.queue_name, task.run_after, task.backend) == (
        priority,
        queue_name,
        run_after,
        backend,
    ):
        return task
    clone = object.__new__(type(task))
    for f in dataclasses.fields(task):
        object.__setattr__(clone, f.name, getattr(task, f.name))
    object.__setattr__(clone, "priority", priority)
    object.__setattr__(clone, "queue_name", queue_name)
    object.__setattr__(clone, "run_after", run_after)
    object.__setattr__(clone, "backend", backend)
    return clone


def errors_from_json(errors: list[dict[str, str]]) -> list[TaskError]:
    return [
        TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
        for e in errors
    ]


def result_from_row(row: dict[str, Any], task: Task | None = None) -> TaskResult:
    """Build a complete ``TaskResult`` from a row's decoded column values."""
    if task is None:
        task = resolve_task(row["task_path"])
    task = rebind_task(
        task,
        priority=row["priority"],
        queue_name=row["queue_name"],
        run_after=row["run_after"],
        backend=row["backend_name"],
    )
    result: TaskResult = TaskResult(
        task=task,
        id=str(row["id"]),
        status=TaskResultStatus(row["status"]),
        enqueued_at=row["enqueued_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        last_attempted_at=row["last_attempted_at"],
        args=row["args"],
        kwargs=row["kwargs"],
        backend=row["backend_name"],
        errors=errors_from_json(row["errors"]),
        worker_ids=list(row["worker_ids"]),
    )
    if row["status"] == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", row["return_value"])
    return result
