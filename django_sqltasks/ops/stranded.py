"""Finding live tasks that the code being deployed could not run: task paths that no longer
import, and stored arguments that no longer bind to the task's signature (``tasks_check``)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Q

from ..compat import Task, TaskResultStatus
from ..core.resolve import resolve_task
from ..exceptions import TaskNotFound
from ..models import TaskRecord

DEFAULT_SAMPLE = 100  # rows per task path whose arguments are bound to the signature
LIVE = (TaskResultStatus.READY, TaskResultStatus.RUNNING)


@dataclass(frozen=True, slots=True)
class Problem:
    """Live tasks of one task path that would fail once this code is deployed."""

    backend: str
    task_path: str
    ready: int
    running: int
    reason: str
    example_id: str  # one of the tasks concerned


@dataclass(slots=True)
class Report:
    """What a check read: how many live tasks and paths, and the problems found."""

    sample: int
    tasks: int = 0
    paths: int = 0
    sampled: int = 0  # rows whose arguments were bound
    problems: list[Problem] | None = None


def check_live_tasks(
    backend: Any, queues: list[str] | None = None, sample: int = DEFAULT_SAMPLE
) -> Report:
    """Check the READY and RUNNING tasks of ``backend`` (in ``queues``, all by default).

    One grouped query counts the live tasks per task path; each path is resolved as a worker
    resolves it; the arguments of up to ``sample`` rows per path are bound to its signature.
    """
    live = (
        TaskRecord.objects.using(backend.database)
        .for_backend(backend.alias)
        .in_queues(queues)
        .filter(status__in=LIVE)
    )
    groups = (
        live.order_by()
        .values("task_path")
        .annotate(
            ready=Count("id", filter=Q(status=TaskResultStatus.READY)),
            running=Count("id", filter=Q(status=TaskResultStatus.RUNNING)),
        )
        .order_by("task_path")
    )
    report = Report(sample=sample, problems=[])
    assert report.problems is not None
    for group in groups:
        report.paths += 1
        report.tasks += group["ready"] + group["running"]
        reason, example = _check_path(backend.alias, group["task_path"], live, sample, report)
        if reason is not None:
            report.problems.append(
                Problem(
                    backend=backend.alias,
                    task_path=group["task_path"],
                    ready=group["ready"],
                    running=group["running"],
                    reason=reason,
                    example_id=str(example),
                )
            )
    return report


def _check_path(
    alias: str, task_path: str, live: Any, sample: int, report: Report
) -> tuple[str | None, Any]:
    """Why the tasks of ``task_path`` would fail (None if they would not), and one example."""
    try:
        task = resolve_task(task_path, backend=alias)
    except TaskNotFound as e:
        return str(e), live.filter(task_path=task_path).order_by().values_list("id", flat=True)[0]
    rows = live.filter(task_path=task_path).order_by().values_list("id", "args", "kwargs")
    failures: list[tuple[Any, str]] = []
    checked = 0
    for task_id, reason in _bind_each(task, rows[:sample]):
        checked += 1
        if reason is not None:
            failures.append((task_id, reason))
    report.sampled += checked
    if not failures:
        return None, None
    first_id, first_reason = failures[0]
    return (
        f"the arguments of {len(failures)} of {checked} sampled task(s) no longer bind to "
        f"{task.name}{_signature(task)}: {first_reason}",
        first_id,
    )


def _bind_each(task: Task, rows: Any) -> Iterator[tuple[Any, str | None]]:
    signature = inspect.signature(task.func)
    try:
        for task_id, args, kwargs in rows:
            yield task_id, _bind(signature, task, args, kwargs)
    except RecursionError:  # JSON nested deeper than Python decodes (PostgreSQL only)
        yield None, "a stored value is nested too deep to decode"


def _bind(signature: inspect.Signature, task: Task, args: Any, kwargs: Any) -> str | None:
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return "the stored args are not a list, or the kwargs not an object"
    if task.takes_context:
        args = [None, *args]  # the TaskContext the worker passes first
    try:
        signature.bind(*args, **kwargs)
    except TypeError as e:
        return str(e)
    return None


def _signature(task: Task) -> str:
    """The task's parameters as ``(a, b=1, *args)``, without annotations."""
    signature = inspect.signature(task.func)
    bare = [p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=bare, return_annotation=inspect.Signature.empty))
