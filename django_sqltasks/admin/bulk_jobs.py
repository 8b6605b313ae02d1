"""The job an action on every task of the task list becomes: a task of its own on the backend,
run by a worker, not by the HTTP request that confirmed it.

It walks the tasks the list's filters and search match (read again through the list's own
``ChangeList``, from the URL's query), newest first from the id where the confirmation page
stopped, in batches of ``BATCH_SIZE``: one statement reads a batch's ids, one changes them
(``store/bulk.py``). It changes at most as many tasks as the confirmation page stated, when it
stated a number. It is a durable task (docs/durable.md): each batch is a step recorded in the
batch's own transaction, so a worker that dies part-way leaves a job that a worker runs on
from the last batch committed, never changing a batch twice. Its progress shows on its task
page; its outcome is its return value and an entry in the admin's history. One such job runs
at a time (its dedupe key): a second one asked for meanwhile is refused.
"""

from __future__ import annotations

import uuid
from contextvars import ContextVar
from typing import Any, cast

from django.contrib.admin.exceptions import NotRegistered
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.sites import all_sites
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.db import connections, router
from django.http import HttpRequest, QueryDict

from ..compat import DEFAULT_TASK_QUEUE_NAME, TaskContext
from ..core.backends import sql_backends
from ..models import TaskRecord, TaskRecordQuerySet
from ..sql import dialect_for
from ..store import bulk
from ..task import SQLTask

JOB_NAME = "bulk_job"  # the module's attribute a stored job's path names (see __getattr__)
BATCH_SIZE = 1000  # tasks per batch: two statements, one short transaction, one step record
JOB_ATTEMPTS = 5  # a job that fails on an error (the database restarting) runs on from its steps
VERBS = {bulk.RETRY: "retried", bulk.CANCEL: "cancelled (or asked to stop)", bulk.DELETE: "deleted"}
DEDUPE_KEY = "admin-bulk-action"


_building: ContextVar[bool] = ContextVar("building_the_job_task", default=False)


class JobUnavailable(Exception):
    """No django-sqltasks backend can run a job over the tasks the admin lists."""


def job_task(database: str) -> SQLTask:
    """The job's task, on the first django-sqltasks backend keeping its tasks in ``database``
    (the admin's), on its default queue; raise ``JobUnavailable`` if there is none."""
    for alias, backend in sql_backends().items():
        if backend.database != database:
            continue
        queues = sorted(backend.queues)
        queue = (
            DEFAULT_TASK_QUEUE_NAME
            if not queues or DEFAULT_TASK_QUEUE_NAME in queues
            else queues[0]
        )
        token = _building.set(True)
        try:
            return SQLTask(
                func=_job,
                backend=alias,
                queue_name=queue,
                takes_context=True,
                max_attempts=JOB_ATTEMPTS,
                retry_backoff=1,
                dedupe=one_at_a_time,
            )
        finally:
            _building.reset(token)
    raise JobUnavailable(
        f"No django-sqltasks backend keeps its tasks in database {database!r}, where the admin "
        "lists them: an action on every task of the list runs as a task of such a backend."
    )


def __getattr__(name: str) -> Any:
    # The job's task is built when a stored job's path is imported (by a worker), not at this
    # module's import: the backends it is declared for may not be loaded yet then.
    # The backend's validation looks the task up here while it is built: it is not yet.
    if name == JOB_NAME and not _building.get():
        return job_task(router.db_for_write(TaskRecord))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def one_at_a_time(*args: Any, **kwargs: Any) -> str:
    """The dedupe key of every job: at most one is READY or RUNNING."""
    return DEDUPE_KEY


def listed(site_name: str, query: str, user_id: Any) -> TaskRecordQuerySet:
    """The tasks the task list of admin site ``site_name`` shows for the URL query ``query``,
    as user ``user_id`` sees it: through the list's own filters and search."""
    site = next((site for site in all_sites if site.name == site_name), None)
    try:
        if site is None:
            raise NotRegistered(site_name)
        model_admin = site.get_model_admin(TaskRecord)
    except NotRegistered as e:
        raise JobUnavailable(f"No admin site named {site_name!r} lists the tasks.") from e
    request = HttpRequest()
    request.method = "GET"
    request.GET = QueryDict(query)
    request.user = get_user_model()._default_manager.get(pk=user_id)
    changelist = model_admin.get_changelist_instance(request)
    return cast(TaskRecordQuerySet, changelist.get_queryset(request))


def _job(
    context: TaskContext,
    kind: str,
    query: str,
    *,
    site: str,
    below: str,
    stated: int | None,
    user: Any,
    size: int = BATCH_SIZE,
    token: str = "",
) -> dict[str, Any]:
    database = sql_backends()[context.task_result.backend].database
    tasks = bulk.eligible(kind, listed(site, query, user)).filter(pk__lt=uuid.UUID(below))
    total = stated
    if total is None:  # the page said "more than N": counted once, for the progress
        total = context.step("count", tasks.order_by().count)  # type: ignore[attr-defined]
    verb = VERBS[kind]
    reason = f"Cancelled in the admin by {username(user)} (every task of a list) before it started."
    changed = batches = 0
    cursor = below
    while stated is None or changed < stated:
        batch = size if stated is None else min(size, stated - changed)
        # The batch's change and its step record commit together: a run after a crash finds
        # every committed batch recorded, and goes on from the last one's cursor.
        with dialect_for(connections[database]).write_transaction():
            done = context.step(  # type: ignore[attr-defined]
                "batch", _batch, kind, database, tasks, cursor, batch, reason
            )
        if done["read"] == 0:
            break
        changed += done["changed"]
        batches += 1
        cursor = done["cursor"]
        context.set_progress(  # type: ignore[attr-defined]
            min(1.0, changed / total) if total else 1.0, f"{changed:,} of {total:,} {verb}"
        )
    outcome = {"kind": kind, "changed": changed, "stated": stated, "batches": batches}
    message = f"{changed:,} task(s) {verb} of every task matching the list ({batches} batch(es))."
    if stated is not None and changed < stated:
        message += f" {stated - changed:,} of the {stated:,} stated no longer qualified."
    with dialect_for(connections[database]).write_transaction():
        context.step("logged", _log, user, kind, changed, f"{message} Filters: ?{query}")  # type: ignore[attr-defined]
    return {**outcome, "message": message}


# Under the name stored jobs name, which __getattr__ serves (as @task would at import).
_job.__name__ = _job.__qualname__ = JOB_NAME


def _batch(
    kind: str, database: str, tasks: TaskRecordQuerySet, cursor: str, size: int, reason: str
) -> dict[str, Any]:
    ids = bulk.next_ids(tasks, uuid.UUID(cursor), size)
    if not ids:
        return {"read": 0, "changed": 0, "cursor": cursor}
    changed = bulk.apply(kind, database, ids, reason)
    return {"read": len(ids), "changed": changed, "cursor": str(ids[-1])}


def username(user_id: Any) -> str:
    """The user name of ``user_id``, or its id if the user is gone."""
    found = get_user_model()._default_manager.filter(pk=user_id).first()
    return found.get_username() if found is not None else f"user {user_id}"


def _log(user: Any, kind: str, changed: int, message: str) -> bool:
    LogEntry.objects.create(
        user_id=user,
        content_type=ContentType.objects.get_for_model(TaskRecord),
        object_repr=f"{VERBS[kind]}: {changed} task(s)"[:200],
        action_flag=CHANGE,
        change_message=message,
    )
    return True
