"""Atomic tasks' transaction on its own: the outcome write decides whether the task's writes
are kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import Group
from django.db import connection

from django_sqltasks.compat import TaskResultStatus, task_backends
from django_sqltasks.models import TaskRecord
from django_sqltasks.sql import dialect_for
from django_sqltasks.worker import attempt as attempts
from django_sqltasks.worker.atomic import run_atomic
from tests import tasks_workflows as wf
from tests.worker.test_parts import WORKER, Completing

pytestmark = pytest.mark.django_db(transaction=True)


def claimed(name: str, marker: Path) -> attempts.Attempt:
    """An atomic_step task claimed by WORKER, ready to run."""
    wf.atomic_step.enqueue(None, name, str(marker))
    with connection.cursor() as cursor:
        [row] = dialect_for(connection).claim(
            cursor, backend_name="default", queue_names=None, worker_id=WORKER, limit=1
        )
    return attempts.prepare(row, task_backends["default"].config)


@pytest.mark.parametrize("still_held", [True, False])
def test_the_task_writes_commit_only_with_its_outcome(tmp_path: Path, still_held: bool) -> None:
    attempt = claimed("atomic", tmp_path / "marker")
    if not still_held:  # rescued and claimed again by another worker meanwhile
        TaskRecord.objects.filter(pk=attempt.row.id).update(owner="another-worker")
    parts = Completing()
    try:
        args, kwargs = attempt.call_args()
        late = run_atomic(parts.completer, attempt, args, kwargs, None, lambda: None)
    finally:
        parts.close()
    assert late is False
    row = TaskRecord.objects.get(pk=attempt.row.id)
    assert Group.objects.filter(name="atomic").exists() is still_held
    if still_held:
        assert (row.status, row.return_value) == (TaskResultStatus.SUCCESSFUL, "atomic")
    else:
        assert (row.status, row.owner) == (TaskResultStatus.RUNNING, "another-worker")
    assert (tmp_path / "marker").read_text() == "atomic\n"  # the file is not the database's
