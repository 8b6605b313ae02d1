"""Build task rows directly, in any state, for tests of the admin and operations."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import Permission, User
from django.db import connection, connections
from django.db.models.expressions import DatabaseDefault
from django.test import Client
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.core.claim_cost import ClaimCost
from django_sqltasks.models import TaskRecord, WorkerRecord
from django_sqltasks.sql import dialect_for
from django_sqltasks.worker.lease import Lease


def task_row(
    status: str = TaskResultStatus.READY,
    *,
    task_path: str = "tests.tasks.add",
    queue_name: str = "default",
    finished_ago: timedelta | None = None,
    now: datetime | None = None,
    **fields: Any,
) -> TaskRecord:
    """Create one task row; finished rows get started/finished times ``finished_ago`` back."""
    now = now or timezone.now()
    values: dict[str, Any] = {
        "task_path": task_path,
        "backend_name": "default",
        "queue_name": queue_name,
        "status": status,
        "args": [1, 2],
        "kwargs": {},
    }
    if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED):
        finished_at = now - (finished_ago or timedelta(0))
        values.update(
            attempts=1,
            started_at=finished_at - timedelta(seconds=1),
            last_attempted_at=finished_at - timedelta(seconds=1),
            finished_at=finished_at,
            worker_ids=["w1"],
        )
    if status == TaskResultStatus.FAILED:
        values["errors"] = [
            {"exception_class_path": "builtins.ValueError", "traceback": "Traceback: boom"}
        ]
    if status == TaskResultStatus.SUCCESSFUL:
        values["return_value"] = 3
    if status == TaskResultStatus.RUNNING:
        values.update(attempts=1, started_at=now, last_attempted_at=now, owner="w1")
    values.update(fields)
    return TaskRecord.objects.create(**values)


def worker_row(
    worker_id: str = "w1",
    claims: ClaimCost | None = None,
    *,
    silent_for: timedelta = timedelta(0),
    measured_ago: timedelta = timedelta(0),
    **fields: Any,
) -> WorkerRecord:
    """Create one worker's row whose heartbeat (the worker's own statement, by the database's
    clock) published ``claims``, dated ``measured_ago`` back, its last heartbeat ``silent_for``
    back."""
    values: dict[str, Any] = {"backend_name": "default", "queue_names": ["*"], "pid": 1}
    values.update(fields)
    WorkerRecord.objects.create(id=worker_id, **values)
    with connection.cursor() as cursor:
        assert dialect_for(connection).heartbeat(cursor, worker_id, claims)
    row = WorkerRecord.objects.get(id=worker_id)
    if measured_ago or silent_for:
        WorkerRecord.objects.filter(id=worker_id).update(
            heartbeat_at=row.heartbeat_at - silent_for,
            claim_measured_at=None
            if row.claim_measured_at is None
            else row.claim_measured_at - measured_ago,
        )
        row.refresh_from_db()
    return row


def worker_lease(worker_id: str, *, concurrency: int = 1, timeout: float = 30) -> Lease:
    """A worker's lease on the default backend, every queue, not registered yet."""
    return Lease(
        worker_id=worker_id,
        backend_name="default",
        database="default",
        queue_names=None,
        concurrency=concurrency,
        timeout=timeout,
        max_rescues=5,
    )


def staff_client(*permissions: str) -> Client:
    """A client logged in as a staff user holding only these permissions (codenames)."""
    user = User.objects.create_user("staff", "staff@example.com", "pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=permissions))
    client = Client()
    client.force_login(user)
    return client


def superuser_client() -> Client:
    """A client logged in as a superuser."""
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    return client


def insert_rows(template: TaskRecord, count: int, vary: Any) -> None:
    """Insert ``count`` copies of the unsaved ``template`` row in one ``executemany`` per
    batch, each changed by ``vary(i)``: a dict of field name to value (a new id is always
    made). The thousands of rows the planner tests need, at a fifth of the CPU of building a
    model instance for each (``bulk_create``)."""
    # Columns the database fills in (db_default) are left out, as Django's INSERT does.
    fields = [
        f
        for f in TaskRecord._meta.concrete_fields
        if not isinstance(getattr(template, f.attname), DatabaseDefault)
    ]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    marks = ", ".join(["%s"] * len(fields))
    sql = f"INSERT INTO {TaskRecord._meta.db_table} ({columns}) VALUES ({marks})"
    base = {f.attname: f.get_db_prep_save(getattr(template, f.attname), connection) for f in fields}
    by_name = {f.name: f for f in fields}
    id_field = by_name["id"]
    rows = []
    for i in range(count):
        values = dict(base)
        values["id"] = id_field.get_db_prep_save(id_field.get_default(), connection)
        for name, value in vary(i).items():
            field = by_name[name]
            values[field.attname] = field.get_db_prep_save(value, connection)
        rows.append(tuple(values[f.attname] for f in fields))
    with connection.cursor() as cursor:
        for start in range(0, count, 1000):
            cursor.executemany(sql, rows[start : start + 1000])


def plan_uses(plan: str, index: str) -> bool:
    """Whether ``plan`` reads ``index``, or, on PostgreSQL's partitioned task table, that
    index in any partition (each leaf's copy has a name of its own; the primary key is each
    leaf's unique index on id)."""
    if index in plan:
        return True
    if connection.vendor != "postgresql":
        return False
    table = TaskRecord._meta.db_table
    with connection.cursor() as cursor:
        if index == f"{table}_pkey":
            cursor.execute(
                "SELECT relname FROM pg_class WHERE relkind = 'i' AND relname LIKE %s",
                [f"{table}%\\_id"],
            )
        else:
            cursor.execute(
                "WITH RECURSIVE parts(oid) AS (SELECT to_regclass(%s)::oid UNION ALL "
                "SELECT i.inhrelid FROM pg_inherits i JOIN parts ON i.inhparent = parts.oid) "
                "SELECT c.relname FROM parts JOIN pg_class c ON c.oid = parts.oid",
                [index],
            )
        return any(name in plan for (name,) in cursor.fetchall())


@contextlib.contextmanager
def held_snapshot() -> Iterator[None]:
    """A second connection holding a REPEATABLE READ snapshot of the task table while the
    block runs, as a report does: vacuum removes no version that dies meanwhile."""
    holder = connections.create_connection("default")
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor.execute(f"SELECT count(*) FROM {TaskRecord._meta.db_table}")
        yield
    finally:
        holder.close()
