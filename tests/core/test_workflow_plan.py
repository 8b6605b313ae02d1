"""What a workflow hands from step to step is bounded by MAX_PAYLOAD_BYTES; its plan keeps each
result in one place; the 1,000-task cap raises InvalidWorkflow."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from django_sqltasks import chain, group
from django_sqltasks.compat import InvalidTask, TaskResultStatus
from django_sqltasks.core.serialization import dumps
from django_sqltasks.core.workflows import MAX_WORKFLOW_TASKS
from django_sqltasks.exceptions import InvalidWorkflow, PayloadTooLarge
from django_sqltasks.models import WorkflowRecord
from django_sqltasks.worker import Worker
from tests import tasks_workflows as wf

pytestmark = pytest.mark.django_db

RunWorker = Callable[..., Worker]
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED
TOO_LARGE = "django_sqltasks.exceptions.PayloadTooLarge"
LIMIT = 1024 * 1024  # the default MAX_PAYLOAD_BYTES of the test backend
MEGABYTE = 1_000_000  # characters of each member's result: under the limit on its own


def plan_bytes(workflow_id: str) -> int:
    plan = WorkflowRecord.objects.values_list("plan", flat=True).get(pk=workflow_id)
    return len(dumps(plan))


@pytest.mark.django_db(transaction=True)
def test_a_callback_over_the_limit_fails_and_the_members_keep_their_results(
    run_worker: RunWorker,
) -> None:
    members = [wf.blob.s(MEGABYTE) for _ in range(24)]
    workflow = group(*members).then(wf.record_results.s("unused")).enqueue()
    run_worker(timeout=120)
    workflow.refresh()
    assert workflow.status == FAILED
    *done, callback = workflow.members
    assert [m.status for m in done] == [SUCCESSFUL] * 24
    assert all(len(m.return_value) == MEGABYTE for m in done)
    assert callback.status == FAILED
    [error] = callback.errors
    assert error.exception_class_path == TOO_LARGE
    assert "MAX_PAYLOAD_BYTES limit of 1,048,576 bytes" in error.traceback
    assert f"encode to {24 * (MEGABYTE + 2):,} bytes" in error.traceback
    assert workflow.failed_step == {
        "task_id": callback.id,
        "path": callback.task.module_path,
        "error": TOO_LARGE,
    }
    # The plan held the members' results only while they fitted what the callback may get.
    assert plan_bytes(workflow.id) < 64 * 1024


@pytest.mark.django_db(transaction=True)
def test_a_group_over_the_limit_without_callback_fails(run_worker: RunWorker) -> None:
    workflow = chain(group(wf.blob.s(MEGABYTE), wf.blob.s(MEGABYTE)), wf.double.s()).enqueue()
    run_worker()
    workflow.refresh()
    assert workflow.status == FAILED
    first, second, after = workflow.members
    assert (first.status, second.status, after.status) == (SUCCESSFUL, SUCCESSFUL, FAILED)
    assert "MAX_PAYLOAD_BYTES limit of 1,048,576 bytes" in after.errors[0].traceback
    assert workflow.failed_step is not None
    assert workflow.failed_step["error"] == TOO_LARGE
    assert plan_bytes(workflow.id) < 64 * 1024


@pytest.mark.django_db(transaction=True)
def test_a_chain_step_given_more_than_the_limit_fails(run_worker: RunWorker) -> None:
    own = "y" * (LIMIT - MEGABYTE)  # with the result handed on, just over the limit
    workflow = chain(wf.blob.s(MEGABYTE), wf.blob_after.s(1, own), wf.double.s()).enqueue()
    run_worker()
    workflow.refresh()
    assert workflow.status == FAILED
    first, second, third = workflow.members
    assert first.status == SUCCESSFUL and len(first.return_value) == MEGABYTE
    assert second.status == FAILED and third.status == FAILED
    assert second.errors[0].exception_class_path == TOO_LARGE
    assert "over the MAX_PAYLOAD_BYTES limit of 1,048,576 bytes" in second.errors[0].traceback
    assert workflow.failed_step is not None
    assert workflow.failed_step["task_id"] == second.id


@pytest.mark.django_db(transaction=True)
def test_the_plan_keeps_a_result_until_it_is_handed_on(run_worker: RunWorker) -> None:
    workflow = chain(wf.blob.s(MEGABYTE), wf.blob_after.s(MEGABYTE), wf.blob_after.s(10)).enqueue()
    run_worker()
    workflow.refresh()
    assert workflow.status == SUCCESSFUL
    assert workflow.return_value == "x" * 10
    assert plan_bytes(workflow.id) < 64 * 1024


def test_enqueue_arguments_over_the_limit_are_refused() -> None:
    with pytest.raises(PayloadTooLarge, match=r"Workflow step tests\.tasks_workflows\.blob"):
        chain(wf.blob.s(1, "y" * (LIMIT - 10))).enqueue("z" * 100)
    assert not WorkflowRecord.objects.exists()


@pytest.mark.parametrize("build", [chain, group])
def test_more_than_the_cap_of_tasks_raises_invalid_workflow(build: Any) -> None:
    steps = [wf.add.s(i, i) for i in range(MAX_WORKFLOW_TASKS + 1)]
    with pytest.raises(InvalidWorkflow, match="at most 1000 tasks") as raised:
        build(*steps).enqueue()
    assert isinstance(raised.value, InvalidTask)  # callers catching InvalidTask still do
    assert not WorkflowRecord.objects.exists()
