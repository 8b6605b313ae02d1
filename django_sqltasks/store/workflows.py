"""A workflow's rows as it runs: moving it on as its steps end, cancelling it, reading it, and
the sweep that catches up with steps ended outside the worker's outcome write (its rows
written at the start, and a running group's new members: ``store/new_workflows.py``).

Every step's task row is written with the workflow. A step whose turn has not come is parked:
READY, but due only in the year 9999 (PARKED), so no claim takes it; its turn comes when the
transaction that stores the outcome of the step before it makes it due. Every change to a
workflow first updates the workflow's row (``lock``): the row lock that serializes two workers
finishing two of its steps at once, so its plan is read and written by one at a time and a
group's callback is released exactly once, on all three databases.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import connections, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from ..compat import TaskResultStatus
from ..core import workflow_plan as plan
from ..core.backends import backend_config
from ..core.serialization import dumps, loads
from ..models import FINISHED_STATUSES, TaskRecord, WorkflowRecord
from ..sql import Outcome, dialect_for
from ..sql.rows import parked_at
from . import control

logger = logging.getLogger("django_sqltasks")

SKIPPED = plan.SKIPPED
SWEEP_LIMIT = 200  # running workflows a sweep looks at, least recently changed first


def complete(
    database: str, outcomes: Sequence[Outcome], write: Callable[[], set[uuid.UUID]]
) -> set[uuid.UUID]:
    """Store ``outcomes`` with ``write`` (the dialect's outcome statement) and move on the
    workflows of those that ended a step, all in one transaction; return the ids written."""
    with transaction.atomic(using=database):
        written = write()
        advance(database, [o for o in outcomes if o.id in written and _ends_step(o)])
    return written


def _ends_step(outcome: Outcome) -> bool:
    return outcome.workflow_id is not None and outcome.status in FINISHED_STATUSES


def advance(database: str, outcomes: Sequence[Outcome]) -> None:
    """Move on the workflows of ``outcomes``, steps that just ended; in the caller's transaction,
    which has stored those outcomes."""
    by_workflow: dict[uuid.UUID, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        assert outcome.workflow_id is not None
        by_workflow[outcome.workflow_id].append(outcome)
    for workflow_id in sorted(by_workflow):  # one lock order for every worker: no deadlock
        record = lock(database, workflow_id)
        if record is None:
            continue  # finished already (cancelled, say): nothing more to start
        ended = [
            (
                str(o.id),
                o.status == TaskResultStatus.SUCCESSFUL,
                None if o.return_value is None else loads(o.return_value),
                o.error_class,
            )
            for o in by_workflow[workflow_id]
        ]
        _move(database, record, ended)


def reconcile(database: str, backend_name: str) -> int:
    """Catch up with steps that ended without moving their workflow on (cancelled, rescued
    for the last time, timed out under a supervisor, salvaged); return the workflows moved.

    Reads only while nothing is amiss: one query of the running workflows, and one of their
    unfinished tasks when there are any.
    """
    running = list(
        WorkflowRecord.objects.using(database)
        .filter(backend_name=backend_name, status=TaskResultStatus.RUNNING)
        .order_by("updated_at")
        .values_list("id", "plan")[:SWEEP_LIMIT]
    )
    if not running:
        return 0
    open_tasks = {
        leaf["id"]: workflow_id
        for workflow_id, root in running
        for leaf in plan.leaves(root)
        if leaf["state"] not in plan.FINISHED
    }
    ended = (
        TaskRecord.objects.using(database)
        .filter(pk__in=list(open_tasks), status__in=FINISHED_STATUSES)
        .values_list("id", flat=True)
    )
    stale = sorted({open_tasks[str(task_id)] for task_id in ended})
    for workflow_id in stale:
        with transaction.atomic(using=database):
            record = lock(database, workflow_id)
            if record is not None:
                _move(database, record, _ended_tasks(database, _open_ids(record.plan)))
    if stale:
        logger.warning(
            "Moved on %d workflow(s) whose steps ended outside an outcome write",
            len(stale),
            extra={"action": "workflow_sweep", "count": len(stale)},
        )
    return len(stale)


def get(database: str, alias: str, workflow_id: str) -> WorkflowRecord:
    """The workflow ``workflow_id`` of backend ``alias``; raise ``LookupError`` naming it."""
    try:
        key = uuid.UUID(str(workflow_id))
        return WorkflowRecord.objects.using(database).get(pk=key, backend_name=alias)
    except (WorkflowRecord.DoesNotExist, ValueError) as e:  # ValueError: not a UUID
        raise LookupError(f"No workflow {workflow_id!r} in backend {alias!r}.") from e


def of_task(database: str, alias: str, result_id: str) -> WorkflowRecord | None:
    """The workflow whose step task ``result_id`` is; None if none, or it was pruned."""
    try:
        key = uuid.UUID(str(result_id))
    except ValueError:
        return None
    workflow_id = (
        TaskRecord.objects.using(database)
        .filter(pk=key, backend_name=alias)
        .values_list("workflow_id", flat=True)
        .first()
    )
    if workflow_id is None:
        return None
    return WorkflowRecord.objects.using(database).filter(pk=workflow_id).first()


def cancel(database: str, workflow_id: str) -> bool:
    """Fail the workflow's steps that have not started and ask its running ones to stop; False
    if it had finished."""
    with transaction.atomic(using=database):
        record = lock(database, uuid.UUID(str(workflow_id)))
        if record is None:
            return False
        unfinished = TaskRecord.objects.using(database).filter(pk__in=plan.cancel(record.plan))
        reason = f"Cancelled with its workflow {workflow_id} before it started."
        # SKIP LOCKED: a step a worker is claiming now is left to run, and nothing waits here.
        control.cancel(unfinished.filter(status=TaskResultStatus.READY), database, reason)
        save(database, record)
    # After the commit: a running step's row may be locked by a worker storing its outcome,
    # which waits for the workflow's lock; asking it to stop under that lock would deadlock.
    control.request_cancel(unfinished.filter(status=TaskResultStatus.RUNNING), database)
    return True


# Internals -------------------------------------------------------------------------------


def lock(database: str, workflow_id: uuid.UUID) -> WorkflowRecord | None:
    """Take the row lock of a running workflow and read it; None if it is not running."""
    workflows = WorkflowRecord.objects.using(database).filter(
        pk=workflow_id, status=TaskResultStatus.RUNNING
    )
    # An UPDATE first: it locks the row on PostgreSQL and MySQL, and takes SQLite's write lock,
    # before the plan is read.
    if not workflows.update(revision=F("revision") + 1, updated_at=timezone.now()):
        return None
    return workflows.select_for_update().get()


def _open_ids(root: plan.Node) -> list[str]:
    """The ids of the tasks of ``root`` that its plan does not know to have ended."""
    return [leaf["id"] for leaf in plan.leaves(root) if leaf["state"] not in plan.FINISHED]


def _ended_tasks(database: str, task_ids: list[str]) -> list[tuple[str, bool, Any, str | None]]:
    """Those of ``task_ids`` whose rows say they have ended, with how."""
    rows = (
        TaskRecord.objects.using(database)
        .filter(pk__in=task_ids, status__in=FINISHED_STATUSES)
        .values_list("id", "status", "return_value", "errors")
    )
    return [
        (
            str(task_id),
            status == TaskResultStatus.SUCCESSFUL,
            value,
            errors[-1].get("exception_class_path") if errors else None,
        )
        for task_id, status, value, errors in rows
    ]


def _move(
    database: str, record: WorkflowRecord, ended: Iterable[tuple[str, bool, Any, str | None]]
) -> None:
    """Record the ``ended`` steps in the locked workflow, make due the steps whose turn came,
    fail those that will never run, and save it."""
    limit = _payload_limit(record.backend_name)
    pending = list(ended)
    while pending:
        moves = plan.Moves()
        for task_id, succeeded, value, error_class in pending:
            step = plan.finish(record.plan, task_id, succeeded, value, error_class, limit)
            moves.releases += step.releases
            moves.skipped += step.skipped
        _fail_skipped(database, moves.skipped)
        # A step taken out of the workflow meanwhile (cancelled in the admin), or failed here
        # for arguments over the limit, has ended: it moves the workflow on in its turn.
        pending = _release(database, moves.releases, limit)
    save(database, record)


def _payload_limit(backend_name: str) -> int | None:
    """The MAX_PAYLOAD_BYTES of the workflow's backend: the most a step may be handed."""
    config = backend_config(backend_name)
    return None if config is None else config.max_payload_bytes  # None: left TASKS meanwhile


def _release(
    database: str, releases: list[plan.Release], limit: int | None
) -> list[tuple[str, bool, Any, str | None]]:
    """Make the parked ``releases`` due, with their arguments; fail those whose arguments
    exceed ``limit`` bytes; return those that ended (failed here, or had ended)."""
    if not releases:
        return []
    now = control.database_now(database)  # due by the clock the claim reads
    tasks = TaskRecord.objects.using(database)
    missed, too_large = [], []
    for release in releases:
        size = len(dumps(release.args)) + len(dumps(release.kwargs))
        if limit is not None and size > limit:
            _fail_skipped(database, [(release.task_id, plan.PAYLOAD_TOO_LARGE, _over(size, limit))])
            too_large.append((release.task_id, False, None, plan.PAYLOAD_TOO_LARGE))
            continue
        made_due = tasks.filter(
            pk=release.task_id, status=TaskResultStatus.READY, available_at__gte=parked_at()
        ).update(
            args=release.args,
            kwargs=release.kwargs,
            available_at=Coalesce(Greatest(F("run_after"), Value(now)), Value(now)),
        )
        if not made_due:
            missed.append(release.task_id)
    queues = set(
        tasks.filter(pk__in=[r.task_id for r in releases]).values_list("queue_name", flat=True)
    )
    announce(database, queues)
    return too_large + (_ended_tasks(database, missed) if missed else [])


def _over(size: int, limit: int) -> str:
    """The error text of a step whose arguments, as the workflow hands them, are too large."""
    return plan.skip_message(
        {
            "message": f"the arguments it would be given (the result handed on to it, then its "
            f"own) encode to {size:,} bytes, over the MAX_PAYLOAD_BYTES limit of {limit:,} "
            "bytes: return smaller results (store large data elsewhere and return its key)."
        }
    )


def _fail_skipped(database: str, skipped: list[tuple[str, str, str]]) -> None:
    """Fail the parked steps that will never run, each with its error class and text."""
    by_error: dict[tuple[str, str], list[str]] = defaultdict(list)
    for task_id, error_class, message in skipped:
        by_error[error_class, message].append(task_id)
    now = timezone.now()
    failed: list[str] = []
    for (error_class, message), task_ids in by_error.items():
        if (
            TaskRecord.objects.using(database)
            .filter(pk__in=task_ids, status=TaskResultStatus.READY, available_at__gte=parked_at())
            .update(
                status=TaskResultStatus.FAILED,
                finished_at=now,
                errors=[{"exception_class_path": error_class, "traceback": message}],
            )
        ):
            failed += task_ids
    if failed:  # their waiters (result.wait()), at commit; a step not failed here reads again
        connection = connections[database]
        with connection.cursor() as cursor:
            dialect_for(connection).announce_finished(cursor, [uuid.UUID(t) for t in failed])


def save(database: str, record: WorkflowRecord) -> None:
    """Write the locked workflow's plan, and its outcome once its root has ended."""
    root = record.plan
    finished = root["state"] in plan.FINISHED
    WorkflowRecord.objects.using(database).filter(pk=record.pk).update(
        plan=root,
        status=root["state"] if finished else TaskResultStatus.RUNNING,
        finished_at=timezone.now() if finished else None,
    )
    if finished:
        failed = plan.failed_step(root)
        logger.info(
            "Workflow id=%s state=%s failed_step=%s",
            record.pk,
            root["state"],
            "-" if failed is None else f"{failed['path']}:{failed['task_id']}",
            extra={"action": "workflow_finished", "workflow_id": record.pk},
        )


def announce(database: str, queues: Iterable[str]) -> None:
    """Wake the workers of ``queues`` at commit, where the database can (PostgreSQL)."""
    names = sorted(queues)
    if names:
        connection = connections[database]
        with connection.cursor() as cursor:
            dialect_for(connection).announce(cursor, names)
