"""Turning stored rows into Django Tasks ``TaskResult`` objects, and dotted paths into tasks.

The trust boundary: a row is trusted to *name* a module, never to bring code. A task path is
imported only if its module is already loaded or belongs to an installed app (or to the
backend's TASK_MODULES), it must name a ``Task`` object, and that task must be declared for
the backend whose row names it. Anything else is refused before it can run, and reading such a
row returns its stored result with a stand-in task that says why.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

from django.utils.module_loading import import_string

from ..compat import Task, TaskError, TaskResult, TaskResultStatus
from ..exceptions import TaskBackendMismatch, TaskNotFound
from ..task import SQLTask
from .progress import NO_METADATA, current_report, no_metadata
from .subject import Subject

# Levels of a stored value kept when a row is read; deeper parts are replaced by CUT_MARKER.
# Above serialization.MAX_DEPTH, so no value enqueue accepted is ever cut.
MAX_READ_DEPTH = 100
CUT_MARKER = f"<cut by django-sqltasks: nested deeper than {MAX_READ_DEPTH} levels>"


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

    def _copy(self, fresh: TaskResult) -> None:
        names = [f.name for f in dataclasses.fields(TaskResult) if f.name not in ("task", "id")]
        for name in (*names, *EXTRA_ATTRS):
            if hasattr(fresh, name):
                object.__setattr__(self, name, getattr(fresh, name))


def resolve_task(task_path: str, *, backend: str | None = None) -> Task:
    """Import ``task_path`` and check that it names a ``Task``; raise ``TaskNotFound`` if not.

    The module is imported only if it is already loaded or belongs to an allowed package (see
    ``allowed_modules``). With ``backend``, the task must also be declared for that backend.
    """
    _check_importable(task_path, backend)
    task = _import_task(task_path)
    if backend is not None:
        check_backend(task, backend)
    return task


@lru_cache(maxsize=1024)
def _import_task(task_path: str) -> Task:
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


def _check_importable(task_path: str, backend: str | None) -> None:
    """Refuse, without importing anything, a path whose module the project has not vouched for."""
    module, _, _ = task_path.rpartition(".")
    if not module or not all(part.isidentifier() for part in task_path.split(".")):
        raise TaskNotFound(
            f"Task path {task_path!r} does not import: it is not a dotted path of Python names."
        )
    if module in sys.modules:
        return  # importing it again runs nothing
    if any(module == p or module.startswith(p + ".") for p in allowed_modules(backend)):
        return
    raise TaskNotFound(
        f"Task path {task_path!r} does not import here, and was not imported: module "
        f"{module!r} is not loaded and is not part of an installed app or of the backend's "
        "TASK_MODULES. A stored task may only name modules of this project."
    )


def allowed_modules(backend: str | None = None) -> set[str]:
    """The packages a stored task path may import: the TASK_MODULES option of ``backend`` (of
    every django-sqltasks backend when None), or the installed apps where it is not set."""
    from django.apps import apps

    from ..backend import SQLTaskBackend
    from ..compat import task_backends

    aliases: Iterable[str] = [backend] if backend is not None else task_backends.settings
    configured: list[tuple[str, ...] | None] = []
    for alias in aliases:
        try:
            instance = task_backends[alias]
        except Exception:  # an unknown or broken alias: no option of its own to read
            continue
        if isinstance(instance, SQLTaskBackend):
            configured.append(instance.config.task_modules)
    if not configured:
        configured.append(None)
    prefixes: set[str] = set()
    for modules in configured:
        if modules is None:
            prefixes.update(app.name for app in apps.get_app_configs())
        else:
            prefixes.update(modules)
    return prefixes


def check_backend(task: Task, backend: str) -> None:
    """Refuse a task declared for another backend than ``backend``, whose row names it."""
    if task.backend != backend:
        raise TaskBackendMismatch(
            f"Task {task.module_path} is declared for backend {task.backend!r}, not "
            f"{backend!r}: a worker of {backend!r} does not run it. Enqueue it through its own "
            f"backend, or declare it with @task(backend={backend!r})."
        )


def rebind_task(
    task: Task, *, priority: int, queue_name: str, run_after: datetime | None, backend: str
) -> Task:
    """Return a copy of ``task`` with the stored options, without validating it again.

    ``Task.using()`` validates against today's settings; a row enqueued under older settings
    (a queue since removed, say) must still be readable and runnable. The task must be declared
    for ``backend``: a row of one backend cannot run another backend's task.
    """
    check_backend(task, backend)
    if (task.priority, task.queue_name, task.run_after) == (priority, queue_name, run_after):
        return task
    clone = object.__new__(type(task))
    for f in dataclasses.fields(task):
        object.__setattr__(clone, f.name, getattr(task, f.name))
    object.__setattr__(clone, "priority", priority)
    object.__setattr__(clone, "queue_name", queue_name)
    object.__setattr__(clone, "run_after", run_after)
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


def errors_from_json(errors: list[dict[str, str]]) -> list[TaskError]:
    return [
        TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
        for e in errors
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


def undecodable_row(records: Any) -> dict[str, Any]:
    """Read the one row of ``records`` column by column, putting CUT_MARKER (in a list, or a
    dict, as the column holds) for each JSON column Python cannot decode without recursing
    too deep."""
    from ..models import TaskRecord

    fields = {f.attname: f for f in TaskRecord._meta.concrete_fields}
    json_columns = {"args": [CUT_MARKER], "kwargs": {"cut": CUT_MARKER}, "return_value": CUT_MARKER}
    row: dict[str, Any] = records.values(*(n for n in fields if n not in json_columns)).get()
    for name, stand_in in json_columns.items():
        try:
            row[name] = records.values_list(name, flat=True).get()
        except RecursionError:
            row[name] = stand_in
    return row
