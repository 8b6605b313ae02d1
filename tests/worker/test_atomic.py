"""Atomic tasks under real worker processes, many at once: each commits its writes with its
outcome on every database (SQLite included), and a timeout rolls them back."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest
from django.contrib.auth.models import Group

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord
from tests import tasks_atomic as tasks
from tests.conftest import WorkerProcess
from tests.events import EventLog

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker_process]

StartWorker = Callable[..., WorkerProcess]
# One worker process with 10 task threads, or a supervisor of two processes of 5 each.
MODES = pytest.mark.parametrize(
    "mode",
    [["--concurrency", "10"], ["--processes", "2", "--concurrency", "5"]],
    ids=["threads", "processes"],
)


def finished(ids: list[str]) -> bool:
    ended = [TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED]
    return not TaskRecord.objects.filter(id__in=ids).exclude(status__in=ended).exists()


def stop(worker: WorkerProcess) -> None:
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output


@MODES
def test_concurrent_atomic_tasks_each_commit_their_row(
    worker_process: StartWorker, events: EventLog, mode: list[str]
) -> None:
    """Each reads its row, then writes it (docs/workflows.md): on SQLite, a deferred
    transaction's write after another's commit failed at once with "database is locked"."""
    rows = [Group.objects.create(name=f"before-{n}") for n in range(10)]
    results = [tasks.rename.enqueue(row.pk, f"after-{n}", 0.1) for n, row in enumerate(rows)]
    ids = [r.id for r in results]
    worker = worker_process(*mode)
    events.until(lambda: finished(ids), "every task to end")
    stop(worker)
    stored = TaskRecord.objects.filter(id__in=ids)
    assert {(t.status, t.attempts) for t in stored} == {(TaskResultStatus.SUCCESSFUL, 1)}, [
        t.errors for t in stored if t.errors
    ]
    names = Group.objects.filter(pk__in=[r.pk for r in rows]).values_list("name", flat=True)
    assert sorted(names) == sorted(f"after-{n}" for n in range(10))


@MODES
def test_an_atomic_task_past_its_timeout_fails_and_keeps_no_write(
    worker_process: StartWorker, events: EventLog, mode: list[str]
) -> None:
    """On SQLite, the TaskTimeout waited for the task's write lock, and the task committed its
    success first."""
    row = Group.objects.create(name="before")
    result = tasks.rename_past_timeout.enqueue(row.pk, "after", 2.5)
    bystander = tasks.rename.enqueue(Group.objects.create(name="other").pk, "other-after")
    worker = worker_process(*mode)
    events.until(lambda: finished([result.id, bystander.id]), "both tasks to end")
    stop(worker)
    if "--processes" not in mode:
        # The late task's thread ended (the stop waits for it) after its outcome was stored.
        assert "ended after its timeout" in worker.output
    result.refresh()
    assert result.status == TaskResultStatus.FAILED, worker.output
    assert [e.exception_class_path for e in result.errors] == [
        "django_sqltasks.exceptions.TaskTimeout"
    ]
    assert Group.objects.get(pk=row.pk).name == "before"  # its write was rolled back
    bystander.refresh()
    assert bystander.status == TaskResultStatus.SUCCESSFUL, worker.output
