"""The workflow sweep: a workflow whose step ended where no worker saw it (cancelled, rescued
for the last time) is moved on, and the sweep comes again once an interval."""

from __future__ import annotations

from django_sqltasks import chain
from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord
from django_sqltasks.store import control
from django_sqltasks.worker.upkeep.workflows import WorkflowSweep
from tests import tasks_workflows as wf
from tests.worker.upkeep.conftest import Guard, later


def test_the_sweep_moves_on_a_workflow_whose_step_ended_elsewhere(db: None, guard: Guard) -> None:
    sweep = WorkflowSweep(database="default", backend_name="default", interval=30)
    workflow = chain(wf.add.s(1, 1), wf.double.s()).enqueue()
    first = TaskRecord.objects.filter(pk=workflow.task_ids[0])
    assert control.cancel(first, using="default", reason="not wanted")  # no worker saw it
    sweep.run(guard)
    workflow.refresh()
    assert workflow.status == TaskResultStatus.FAILED
    assert guard.ran == ["Moving workflows on"]
    assert not sweep.due()
    later(sweep, 31)
    assert sweep.due()
    assert sweep.sweep() == 0  # nothing left to move
