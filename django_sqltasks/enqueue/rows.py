"""Building the rows an enqueue writes: each call checked as Django Tasks asks, encoded once,
and sized against the backend's and the server's limits, before anything is written.

Shared by the backend's enqueues and by workflows (``store/workflows.py``), so both build a
task row the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from django.apps import apps
from django.utils import timezone

from ..compat import (
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskResult,
    TaskResultStatus,
)
from ..core.backends import SQLBackend
from ..core.binding import check_binds
from ..core.limits import limit_key
from ..core.options import BackendOptions, OptionError
from ..core.policy import dedupe_key
from ..core.progress import NO_METADATA
from ..core.resolve import unimportable_by_workers
from ..core.serialization import check_arguments, dumps, normalized
from ..core.subject import subject_of_task
from ..exceptions import PayloadTooLarge
from ..ids import new_task_id
from ..sql import NewTask, installation, packet
from ..sql.rows import RESERVED_FROM
from ..task import EXTRA_ATTRS, RESULT_FIELDS, SQLTaskResult

Build = Callable[[Task, Any, Any], tuple[NewTask, TaskResult]]
MAX_VALIDATED_TASKS = 4096  # remembered per backend instance; forgotten all at once when full
# SQLTaskResult's fields in order: new_row sets them one by one, without its __init__ (whose
# __post_init__ walks the checked arguments again with normalize_json), only while they are
# exactly these.
READY_RESULT_FIELDS = (*RESULT_FIELDS, *EXTRA_ATTRS)
_DIRECT_RESULT = tuple(f.name for f in dataclasses.fields(SQLTaskResult)) == READY_RESULT_FIELDS
_new_object = object.__new__
# Each field's slot written through its descriptor: half the time of object.__setattr__,
# which looks the slot up on the class for every field.
_READY_SETTERS = (
    tuple(getattr(SQLTaskResult, name).__set__ for name in READY_RESULT_FIELDS)
    if _DIRECT_RESULT
    else ()
)


class RowBuilder:
    """Builds one backend's rows, validating each task once per backend instance. Django makes
    a new backend instance when TASKS changes, so a task is checked again against new settings,
    as the contract asks."""

    def __init__(self, backend: SQLBackend) -> None:
        self._backend = backend
        self._validated: dict[Task, bool] = {}  # any thread may add; a lost entry costs a check

    def row(self, task: Task, args: Any, kwargs: Any) -> tuple[NewTask, TaskResult]:
        """The row of one call of ``task`` (a workflow step's, whose arguments come later)."""
        self._validate_once(task)
        backend = self._backend
        traceparent = backend.tracing.traceparent() if backend.tracing is not None else None
        return new_row(
            task, args, kwargs, alias=backend.alias, config=backend.config, traceparent=traceparent
        )

    def call(self, task: Task, args: Any, kwargs: Any) -> tuple[NewTask, TaskResult]:
        """``row``, for a call made now: its arguments must fit the function's parameters."""
        row, result = self.row(task, args, kwargs)
        check_binds(task, result.args, result.kwargs)
        return row, result

    def _validate_once(self, task: Task) -> None:
        try:
            if task in self._validated:
                return
        except TypeError:  # an unhashable option value: validate every time
            self._validate(task)
            return
        self._validate(task)
        if len(self._validated) >= MAX_VALIDATED_TASKS:
            self._validated.clear()
        self._validated[task] = True

    def _validate(self, task: Task) -> None:
        """``validate_task``, and what only an enqueue must refuse (not a declaration, which may
        happen in a module that is never enqueued from): a task a worker would not import."""
        self._backend.validate_task(task)
        unimportable = unimportable_by_workers(task.module_path, self._backend.alias)
        if unimportable is not None:
            raise InvalidTask(unimportable)


def check_usable(alias: str, options_error: OptionError | None) -> None:
    """Refuse to enqueue through a backend whose OPTIONS are wrong, or without the app."""
    if options_error is not None:
        raise InvalidTaskBackend(str(options_error))
    # Without the app its model cannot load: say so before Django's app_label error.
    if not apps.is_installed("django_sqltasks"):
        raise InvalidTaskBackend(installation.not_installed(alias))


def new_row(
    task: Task,
    args: Any,
    kwargs: Any,
    *,
    alias: str,
    config: BackendOptions,
    traceparent: str | None = None,
) -> tuple[NewTask, TaskResult]:
    """The row of one call of ``task`` (validated already), and the result ``enqueue()``
    returns for it; raise for arguments that cannot be stored, naming the rule."""
    check_arguments(args, kwargs)
    if task.run_after is not None:
        check_run_after(task.run_after)
    now = timezone.now()
    task_id = new_task_id()
    result = ready_result(task, str(task_id), now, normalized(args), normalized(kwargs), alias)
    row = NewTask(
        id=task_id,
        task_path=task.module_path,
        backend_name=alias,
        queue_name=task.queue_name,
        priority=task.priority,
        args=result.args,
        kwargs=result.kwargs,
        enqueued_at=now,
        run_after=task.run_after,
        args_json=dumps(result.args),
        kwargs_json=dumps(result.kwargs),
        dedupe_key=dedupe_key(task, result.args, result.kwargs),
        limit_key=limit_key(task, result.args, result.kwargs),
        trace_parent=traceparent,
        tags=getattr(task, "tags", ()),
    )
    limit = config.max_payload_bytes
    if limit is not None:
        size = len(row.args_json) + len(row.kwargs_json)
        if size > limit:
            raise PayloadTooLarge(
                f"Task arguments of {task.module_path} encode to {size} bytes, over the "
                f"MAX_PAYLOAD_BYTES limit of {limit}: store large data elsewhere and pass "
                "its key."
            )
    return row, result


def check_run_after(run_after: datetime) -> None:
    """Refuse a ``run_after`` the workers could take for one of their marks: from
    RESERVED_FROM on, ``available_at`` marks suspects and waiting workflow steps."""
    reserved = RESERVED_FROM if run_after.tzinfo is not None else RESERVED_FROM.replace(tzinfo=None)
    if run_after >= reserved:
        raise InvalidTask(
            f"run_after must be before {reserved:%Y-%m-%d %H:%M} UTC, not {run_after}: later "
            "dates mark the tasks workers set aside (suspects, waiting workflow steps)."
        )


def ready_result(
    task: Task, task_id: str, now: datetime, args: list[Any], kwargs: dict[str, Any], alias: str
) -> TaskResult:
    """The READY result ``enqueue()`` returns, its arguments normalized already."""
    if not _DIRECT_RESULT:
        result: TaskResult = SQLTaskResult(
            task=task,
            id=task_id,
            status=TaskResultStatus.READY,
            enqueued_at=now,
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=args,
            kwargs=kwargs,
            backend=alias,
            errors=[],
            worker_ids=[],
            subject=subject_of_task(task),
        )
        return result
    result = _new_object(SQLTaskResult)
    # READY_RESULT_FIELDS in order, as rows of the two dataclasses:
    # fmt: off
    values: tuple[Any, ...] = (
        task, task_id, TaskResultStatus.READY, now, None, None, None, args, kwargs, alias,
        [], [], None,  # errors, worker_ids, _return_value
        None, "", NO_METADATA, None, subject_of_task(task), None,  # EXTRA_ATTRS
    )
    # fmt: on
    for set_field, value in zip(_READY_SETTERS, values, strict=True):
        set_field(result, value)
    return result


def new_rows(
    task: Task, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]], build: Build
) -> tuple[list[NewTask], list[TaskResult]]:
    """The rows of ``enqueue_many``: every call built with ``build``, a bad one named by its
    index in ``calls``."""
    rows: list[NewTask] = []
    results: list[TaskResult] = []
    for index, call in enumerate(calls):
        try:
            args, kwargs = call
        except (TypeError, ValueError) as e:
            raise TypeError(f"calls[{index}] must be an (args, kwargs) pair, not {call!r}.") from e
        try:
            row, result = build(task, args, kwargs)
        except (TypeError, ValueError, InvalidTask) as e:
            raise type(e)(f"calls[{index}]: {e}") from e
        rows.append(row)
        results.append(result)
    return rows, results


def check_packet(rows: Sequence[NewTask], limit: int | None, many: bool = False) -> None:
    """Refuse a row whose INSERT would exceed the server's max_allowed_packet (MySQL)."""
    if limit is None:
        return
    for index, row in enumerate(rows):
        size = packet.row_size(row) + packet.STATEMENT_OVERHEAD
        if size > limit:
            where = f"calls[{index}]: " if many else ""
            raise PayloadTooLarge(
                f"{where}Task arguments of {row.task_path} make a statement of about {size} "
                f"bytes, which exceeds the server's max_allowed_packet of {limit} bytes "
                "(MySQL and MariaDB drop the connection on a larger statement): store large "
                "data elsewhere and pass its key, or raise max_allowed_packet."
            )
