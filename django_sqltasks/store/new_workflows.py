"""A new workflow's rows (``enqueue``: its row and all its tasks', the same INSERT as
``enqueue()``'s, through ``enqueue/writes.py``), and the new members of a running group
(``add_to_group``). Every step's task row is written with the workflow, the steps whose turn
has not come parked (see ``store/workflows.py``, which moves it on from there)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.db import transaction

from ..compat import TaskResult
from ..core import workflow_plan as plan
from ..core.backends import SQLBackend
from ..core.serialization import check_arguments, dumps
from ..core.workflows import MAX_WORKFLOW_TASKS, member_nodes
from ..enqueue import writes
from ..exceptions import InvalidWorkflow, PayloadTooLarge
from ..ids import new_task_id
from ..models import TaskRecord, WorkflowRecord
from ..sql import NewTask
from ..sql.rows import parked_at
from . import control
from .workflows import announce, lock, save


def enqueue(
    backend: SQLBackend,
    root: plan.Node,
    tasks: plan.StepCalls,
    args: list[Any],
    kwargs: dict[str, Any],
) -> WorkflowRecord:
    """Enqueue a workflow: write its row and the rows of all its tasks (every one of
    ``backend``), its first steps due and the rest parked, in one transaction that joins the
    caller's."""
    backend.check_usable()
    check_arguments(args, kwargs)
    workflow_id = new_task_id()
    now = control.database_now(backend.database)  # first steps are due by the claim's clock
    steps = _task_rows(backend, tasks, workflow_id)
    for leaf in plan.leaves(root):
        leaf["id"] = str(steps[leaf["id"]][0].id)
    by_id = {str(row.id): (row, result) for row, result in steps.values()}
    started: list[NewTask] = []
    for release in plan.start(root, args, kwargs):
        row, result = by_id[release.task_id]
        check_arguments(release.args, release.kwargs)
        _check_size(backend, row.task_path, release)
        row.args, row.kwargs = release.args, release.kwargs
        row.args_json, row.kwargs_json = dumps(release.args), dumps(release.kwargs)
        object.__setattr__(result, "args", release.args)
        object.__setattr__(result, "kwargs", release.kwargs)
        row.available_at = max(row.run_after or now, now)
        started.append(row)
    database = backend.database
    rows = [row for row, _ in steps.values()]
    with transaction.atomic(using=database):
        workflow = WorkflowRecord.objects.using(database).create(
            id=workflow_id, backend_name=backend.alias, plan=root, created_at=now, updated_at=now
        )
        # The same INSERT as enqueue()'s; each step's subject as enqueue() stores it.
        writes.insert(database, rows, notify=False)
        for row, result in steps.values():
            writes.store_subject(database, [row], result.task)
        if backend.config.notify:
            announce(database, {row.queue_name for row in started})
    # Wakes this process's idle workers of the due steps' queues, and sends task_enqueued.
    results = [result for _, result in steps.values()]
    writes.after_write(database, type(backend), started, results)
    return workflow


def add_to_group(backend: SQLBackend, task_id: uuid.UUID, steps: Sequence[Any]) -> list[str]:
    """Add ``steps`` to the group that task ``task_id`` (running) is a member of, and start
    them; its callback waits for them too. In one transaction that joins the caller's (the
    step that records the add, ``context.add_to_group``). Return the new tasks' ids."""
    nodes, tasks = member_nodes(steps)
    database = backend.database
    # Read before the transaction, whose first statement must write (SQLite: a transaction
    # that reads first cannot write once another has; inside context.add_to_group's, which
    # took the write lock as it began, it is a savepoint); a task's workflow never changes.
    workflow_id = (
        TaskRecord.objects.using(database)
        .filter(pk=task_id)
        .values_list("workflow_id", flat=True)
        .first()
    )
    with transaction.atomic(using=database):
        record = None if workflow_id is None else lock(database, workflow_id)
        group = None if record is None else plan.group_of(record.plan, str(task_id))
        if workflow_id is None or record is None or group is None:
            raise InvalidWorkflow(
                f"Task {task_id} is not a member of a running group: add_to_group() adds to "
                "the group the calling task runs in."
            )
        total = sum(1 for _ in plan.leaves(record.plan)) + len(tasks)
        if total > MAX_WORKFLOW_TASKS:
            raise InvalidWorkflow(
                f"A workflow may have at most {MAX_WORKFLOW_TASKS} tasks; adding {len(tasks)} "
                f"would make {total}: enqueue a workflow of their own."
            )
        rows = _task_rows(backend, tasks, workflow_id)
        for node in nodes:
            for leaf in plan.leaves(node):
                leaf["id"] = str(rows[leaf["id"]][0].id)
        by_id = {str(row.id): row for row, _ in rows.values()}
        now = control.database_now(database)
        started: list[NewTask] = []
        for release in plan.add_members(group, nodes):
            row = by_id[release.task_id]
            check_arguments(release.args, release.kwargs)
            row.args, row.kwargs = release.args, release.kwargs
            row.args_json, row.kwargs_json = dumps(release.args), dumps(release.kwargs)
            row.available_at = max(row.run_after or now, now)
            started.append(row)
        writes.insert(database, [row for row, _ in rows.values()], notify=False)
        save(database, record)
        if backend.config.notify:
            announce(database, {row.queue_name for row in started})
    writes.after_write(database, type(backend), started, [result for _, result in rows.values()])
    return [str(row.id) for row, _ in rows.values()]


def _check_size(backend: SQLBackend, path: str, release: plan.Release) -> None:
    """Refuse a first step whose arguments, with ``enqueue()``'s before its own, exceed
    MAX_PAYLOAD_BYTES (its own were checked alone)."""
    limit = backend.config.max_payload_bytes
    if limit is None:
        return
    size = len(dumps(release.args)) + len(dumps(release.kwargs))
    if size > limit:
        raise PayloadTooLarge(
            f"Workflow step {path}: its arguments (enqueue()'s, then its own) encode to {size} "
            f"bytes, over the MAX_PAYLOAD_BYTES limit of {limit}: store large data elsewhere "
            "and pass its key."
        )


def _task_rows(
    backend: SQLBackend,
    tasks: plan.StepCalls,
    workflow_id: uuid.UUID,
) -> dict[int, tuple[NewTask, TaskResult]]:
    """The parked rows of a new workflow's tasks, each checked as ``enqueue()`` checks it."""
    steps: dict[int, tuple[NewTask, TaskResult]] = {}
    for key, (task, own_args, own_kwargs) in tasks.items():
        if getattr(task, "dedupe", False):
            raise InvalidWorkflow(
                f"{task.module_path} deduplicates (dedupe=...): a workflow step cannot, since "
                "its row waits in the table for its turn. Enqueue it without the workflow."
            )
        row, result = backend.new_row(task, own_args, own_kwargs)
        row.workflow_id = workflow_id
        row.available_at = parked_at()  # until plan.start() or a step before it releases it
        steps[key] = (row, result)
    return steps
