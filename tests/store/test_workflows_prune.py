"""Pruning finished workflows with their tasks, through the index that serves it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.core.workflows import workflow_of
from django_sqltasks.models import TaskRecord, WorkflowRecord
from django_sqltasks.store.pruning import prune

pytestmark = pytest.mark.django_db(transaction=True)  # ANALYZE TABLE commits on MySQL

SUCCESSFUL, FAILED, RUNNING = (
    TaskResultStatus.SUCCESSFUL,
    TaskResultStatus.FAILED,
    TaskResultStatus.RUNNING,
)


def workflow(status: str, days_ago: float | None, backend: str = "default") -> WorkflowRecord:
    finished = None if days_ago is None else timezone.now() - timedelta(days=days_ago)
    return WorkflowRecord.objects.create(
        backend_name=backend, status=status, plan={}, finished_at=finished
    )


def test_finished_workflows_go_as_old_as_the_tasks_of_their_outcome() -> None:
    old_ok, old_failed = workflow(SUCCESSFUL, 20), workflow(FAILED, 40)
    kept = [workflow(SUCCESSFUL, 1), workflow(FAILED, 20), workflow(RUNNING, None)]
    other_backend = workflow(SUCCESSFUL, 20, backend="other")
    assert prune(using="default", backend="default", dry_run=True).workflows == 2
    pruned = prune(using="default", backend="default", successful_days=14, failed_days=30)
    assert pruned.workflows == 2
    assert pruned.total == 0  # tasks only
    left = set(WorkflowRecord.objects.values_list("pk", flat=True))
    assert left == {w.pk for w in [*kept, other_backend]}
    assert old_ok.pk not in left and old_failed.pk not in left


def test_a_step_outliving_its_pruned_workflow_names_none() -> None:
    from django_sqltasks import chain
    from tests import tasks_workflows as wf

    workflow_id = chain(wf.add.s(1, 1)).enqueue().id
    WorkflowRecord.objects.filter(pk=workflow_id).delete()
    member = TaskRecord.objects.get(workflow_id=workflow_id).task_result
    assert workflow_of(member) is None


def test_pruning_one_queue_leaves_workflows_alone() -> None:
    workflow(SUCCESSFUL, 20)
    assert prune(using="default", backend="default", queue="default").workflows == 0
    assert WorkflowRecord.objects.count() == 1


def test_tasks_prune_says_how_many_workflows_it_deleted(capsys: pytest.CaptureFixture[str]) -> None:
    workflow(SUCCESSFUL, 20)
    call_command("tasks_prune")
    assert "Deleted 1 finished workflow(s) as old." in capsys.readouterr().out


def test_pruning_reads_finished_workflows_through_their_index() -> None:
    now = timezone.now()
    rows = [
        WorkflowRecord(
            backend_name="default" if i % 10 else "other",
            status=(RUNNING, SUCCESSFUL, FAILED)[i % 3],
            plan={},
            finished_at=None if i % 3 == 0 else now - timedelta(days=i % 5),
        )
        for i in range(3000)
    ]
    WorkflowRecord.objects.bulk_create(rows, batch_size=500)
    table = WorkflowRecord._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"ANALYZE {table}")
        elif connection.vendor == "sqlite":
            cursor.execute("ANALYZE")
        else:
            cursor.execute(f"ANALYZE TABLE {table}")
            cursor.fetchall()
    old = WorkflowRecord.objects.filter(
        backend_name="default", status=SUCCESSFUL, finished_at__lte=now - timedelta(days=30)
    )
    plan = old.values_list("pk", flat=True)[:1000].explain()
    assert "sqltasks_workflow_finished_idx" in plan, plan
