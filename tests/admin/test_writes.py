"""The admin's pages that write (a schedule saved or deleted, a queue limit set, a finished
task, a limit row or a dead worker's row deleted) while a worker writes: on SQLite they wait
for the write lock instead of failing with "database is locked" (a transaction that read
before another connection wrote cannot write at all)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from django_sqltasks.models import (
    QueueLimitOverride,
    ScheduleRecord,
    TaskLimit,
    TaskRecord,
    WorkerRecord,
)
from tests.factories import superuser_client, task_row

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "sqlite",
        reason="SQLite's lock: other databases let a transaction write after it read",
    ),
]

TICK = "tests.tasks.tick"
SCHEDULES = "/admin/django_sqltasks/schedulerecord/"
LIMITS = "/admin/django_sqltasks/queuelimitoverride/"
TASK_LIMITS = "/admin/django_sqltasks/tasklimit/"
TASKS = "/admin/django_sqltasks/taskrecord/"
WORKERS = "/admin/django_sqltasks/workerrecord/"
OLD = timezone.now() - timedelta(days=1)  # a heartbeat that long ago: the worker is dead


class WorkerWrite:
    """A worker's write on a connection of its own, made once the page has read its first row
    (its transaction holds a snapshot from then on): ``blocked`` says whether the page held the
    write lock already, so that the worker had to wait for it."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.blocked: bool | None = None

    def __call__(self, execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        result = execute(sql, *args)
        if (
            self.blocked is None
            and connection.in_atomic_block  # the page's transaction, not the login's reads
            and sql.lstrip().upper().startswith("SELECT")
        ):
            self.blocked = not self._write()
        return result

    def _write(self) -> bool:
        """Write as a worker advancing a schedule would; False if the lock was held."""
        other = sqlite3.connect(connection.settings_dict["NAME"], timeout=0)
        try:
            try:
                other.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as e:
                if "locked" not in str(e):
                    raise
                return False
            # A change SQLite must store (it skips a row rewritten with the same values).
            other.execute(f"UPDATE {self.table} SET revision = revision + 1 WHERE name = 'side'")
            other.execute("COMMIT")
            return True
        finally:
            other.close()


@pytest.fixture
def worker_write() -> Iterator[WorkerWrite]:
    ScheduleRecord.objects.create(backend_name="default", name="side", task_path=TICK, every=60)
    write = WorkerWrite(ScheduleRecord._meta.db_table)
    # Every statement of this thread's connection passes through it: the test client's
    # request runs on this thread.
    assert threading.current_thread() is threading.main_thread()
    with connection.execute_wrapper(write):
        yield write


def schedule() -> ScheduleRecord:
    return ScheduleRecord.objects.create(
        backend_name="default", name="nightly", origin="admin", task_path=TICK, cron="0 3 * * *"
    )


def schedule_form(**fields: str) -> dict[str, str]:
    data = {
        "backend_name": "default",
        "name": "nightly",
        "enabled": "on",
        "task_path": TICK,
        "args": "[]",
        "kwargs": "{}",
        "cron": "0 3 * * *",
        "time_zone": "UTC",
        "every": "",
        "queue_name": "",
        "priority": "",
    }
    return {**data, **fields}


def post(client: Client, url: str, data: dict[str, Any]) -> int:
    client.raise_request_exception = False  # a 500 is what the test looks for
    status: int = client.post(url, data).status_code
    return status


def test_a_schedule_saved_while_a_worker_writes(worker_write: WorkerWrite) -> None:
    client, row = superuser_client(), schedule()
    assert post(client, f"{SCHEDULES}{row.pk}/change/", schedule_form(cron="0 4 * * *")) == 302
    assert worker_write.blocked is True  # the page held the lock: the worker waited
    row.refresh_from_db()
    assert (row.cron, row.revision) == ("0 4 * * *", 1)


def test_a_schedule_deleted_while_a_worker_writes(worker_write: WorkerWrite) -> None:
    client, row = superuser_client(), schedule()
    assert post(client, f"{SCHEDULES}{row.pk}/delete/", {"post": "yes"}) == 302
    assert worker_write.blocked is True
    assert not ScheduleRecord.objects.filter(pk=row.pk).exists()


def test_a_queue_limit_set_while_a_worker_writes(worker_write: WorkerWrite) -> None:
    client = superuser_client()
    data = {"backend_name": "default", "queue_name": "other", "concurrency_limit": "3"}
    assert post(client, f"{LIMITS}add/", {**data, "rate_limit": ""}) == 302
    assert worker_write.blocked is True
    assert QueueLimitOverride.objects.get(queue_name="other").concurrency == 3


def test_a_task_limit_deleted_while_a_worker_writes(worker_write: WorkerWrite) -> None:
    """The limits page deletes a limit row (workers write it again when they next claim)."""
    client = superuser_client()
    row = TaskLimit.objects.create(backend_name="default", key=f"task:{TICK}", concurrency=2)
    assert post(client, f"{TASK_LIMITS}{row.pk}/delete/", {"post": "yes"}) == 302
    assert worker_write.blocked is True
    assert not TaskLimit.objects.filter(pk=row.pk).exists()


def test_a_finished_task_deleted_while_a_worker_writes(worker_write: WorkerWrite) -> None:
    client, row = superuser_client(), task_row("SUCCESSFUL")
    assert post(client, f"{TASKS}{row.pk}/delete/", {"post": "yes"}) == 302
    assert worker_write.blocked is True
    assert not TaskRecord.objects.filter(pk=row.pk).exists()


def test_a_dead_worker_deleted_while_a_worker_writes(worker_write: WorkerWrite) -> None:
    client = superuser_client()
    row = WorkerRecord.objects.create(
        id="gone", backend_name="default", hostname="elsewhere", pid=1, heartbeat_at=OLD
    )
    assert post(client, f"{WORKERS}{row.pk}/delete/", {"post": "yes"}) == 302
    assert worker_write.blocked is True
    assert not WorkerRecord.objects.filter(pk=row.pk).exists()
