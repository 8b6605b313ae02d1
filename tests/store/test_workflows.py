"""Chains and groups, run by an in-process worker on the test database."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group
from django.db import connections
from django.utils import timezone

from django_sqltasks import chain, group
from django_sqltasks.compat import InvalidTask, TaskResultStatus
from django_sqltasks.core.workflows import get_workflow, signature, workflow_of
from django_sqltasks.exceptions import InvalidWorkflow
from django_sqltasks.models import TaskRecord, WorkflowRecord
from django_sqltasks.sql.rows import PARKED
from django_sqltasks.store.workflows import SKIPPED
from django_sqltasks.worker import Worker
from tests import tasks
from tests import tasks_workflows as wf

pytestmark = pytest.mark.django_db

RunWorker = Callable[..., Worker]
SUCCESSFUL, FAILED, READY = (
    TaskResultStatus.SUCCESSFUL,
    TaskResultStatus.FAILED,
    TaskResultStatus.READY,
)


def states(workflow: Any) -> list[str]:
    return [member.status for member in workflow.members]


@pytest.mark.django_db(transaction=True)
def test_a_chain_hands_each_result_to_the_next_step(run_worker: RunWorker) -> None:
    workflow = chain(wf.add.s(1, 2), wf.double.s(), wf.double).enqueue()
    first, second, _ = workflow.members
    assert first.status == READY and first.args == [1, 2]
    assert TaskRecord.objects.get(pk=second.id).available_at == PARKED
    run_worker()
    workflow.refresh()
    assert workflow.status == SUCCESSFUL
    assert workflow.return_value == 12
    assert states(workflow) == [SUCCESSFUL] * 3
    assert [m.args for m in workflow.members] == [[1, 2], [3], [6]]


@pytest.mark.django_db(transaction=True)
def test_enqueue_arguments_go_to_the_first_steps(run_worker: RunWorker) -> None:
    workflow = chain(wf.add, wf.double).enqueue(2, b=3)
    run_worker()
    workflow.refresh()
    assert workflow.return_value == 10


@pytest.mark.django_db(transaction=True)
def test_a_group_callback_gets_every_result_in_order(run_worker: RunWorker) -> None:
    workflow = group(wf.add.s(1, 1), wf.add.s(2, 2), wf.add.s(3, 3)).then(wf.total.s()).enqueue()
    run_worker()
    workflow.refresh()
    assert workflow.status == SUCCESSFUL
    assert workflow.return_value == {"sum": 12, "failures": None}
    callback = workflow.members[-1]
    assert callback.args == [[2, 4, 6]]


@pytest.mark.django_db(transaction=True)
def test_a_group_without_callback_returns_the_list(run_worker: RunWorker) -> None:
    workflow = group(wf.add.s(1, 1), wf.double.s(5)).enqueue()
    run_worker()
    workflow.refresh()
    assert workflow.return_value == [2, 10]


@pytest.mark.django_db(transaction=True)
def test_a_failed_member_skips_the_callback_by_default(run_worker: RunWorker) -> None:
    workflow = group(wf.add.s(1, 1), wf.boom.s()).then(wf.total.s()).enqueue()
    run_worker()
    workflow.refresh()
    assert workflow.status == FAILED
    assert states(workflow) == [SUCCESSFUL, FAILED, FAILED]
    callback = workflow.members[-1]
    assert [e.exception_class_path for e in callback.errors] == [SKIPPED]
    assert "tests.tasks_workflows.boom" in callback.errors[0].traceback
    assert "builtins.ValueError" in callback.errors[0].traceback
    assert workflow.failed_step == {
        "task_id": workflow.members[1].id,
        "path": "tests.tasks_workflows.boom",
        "error": "builtins.ValueError",
    }


@pytest.mark.django_db(transaction=True)
def test_on_failure_run_lists_the_failures(run_worker: RunWorker) -> None:
    workflow = group(wf.add.s(1, 1), wf.boom.s()).then(wf.total.s(), on_failure="run").enqueue()
    run_worker()
    workflow.refresh()
    boom_id = workflow.members[1].id
    assert workflow.status == SUCCESSFUL
    assert workflow.return_value == {
        "sum": 2,
        "failures": [
            {
                "index": 1,
                "task_id": boom_id,
                "path": "tests.tasks_workflows.boom",
                "error": "builtins.ValueError",
            }
        ],
    }


@pytest.mark.django_db(transaction=True)
def test_a_failed_step_ends_the_chain_and_fails_the_rest(run_worker: RunWorker) -> None:
    workflow = chain(wf.add.s(1, 1), wf.boom.s(), wf.double.s(), wf.double.s()).enqueue()
    run_worker()
    workflow.refresh()
    assert workflow.status == FAILED
    assert states(workflow) == [SUCCESSFUL, FAILED, FAILED, FAILED]
    for skipped in workflow.members[2:]:
        assert [e.exception_class_path for e in skipped.errors] == [SKIPPED]
        assert workflow.members[1].id in skipped.errors[0].traceback
    assert not TaskRecord.objects.filter(status=READY).exists()


@pytest.mark.django_db(transaction=True)
def test_a_chain_step_may_be_a_group_and_a_member_a_chain(run_worker: RunWorker) -> None:
    workflow = chain(
        wf.add.s(1, 1),
        group(wf.double.s(), chain(wf.double.s(), wf.double.s())).then(wf.sum_of.s()),
        wf.double.s(),
    ).enqueue()
    run_worker()
    workflow.refresh()
    # 2 -> [4, 8] -> 12 -> 24
    assert workflow.return_value == 24
    assert states(workflow) == [SUCCESSFUL] * 6


@pytest.mark.django_db(transaction=True)
def test_a_failure_inside_a_nested_chain_fails_the_group(run_worker: RunWorker) -> None:
    workflow = chain(
        group(wf.add.s(1, 1), chain(wf.boom.s(), wf.double.s())).then(wf.sum_of.s()),
        wf.double.s(),
    ).enqueue()
    run_worker()
    workflow.refresh()
    assert workflow.status == FAILED
    assert states(workflow) == [SUCCESSFUL, FAILED, FAILED, FAILED, FAILED]
    assert workflow.failed_step is not None
    assert workflow.failed_step["path"] == "tests.tasks_workflows.boom"


@pytest.mark.django_db(transaction=True)
def test_a_step_retries_before_the_chain_moves_on(run_worker: RunWorker, tmp_path: Path) -> None:
    marker = tmp_path / "flaky"
    workflow = chain(wf.flaky.s(1, str(marker)), wf.double.s()).enqueue()
    run_worker()
    workflow.refresh()
    assert workflow.return_value == 4
    flaky = workflow.members[0]
    assert flaky.attempts == 2
    assert [e.exception_class_path for e in flaky.errors] == ["builtins.ConnectionError"]


@pytest.mark.django_db(transaction=True)
def test_cancel_fails_every_step_that_has_not_run(run_worker: RunWorker) -> None:
    workflow = chain(wf.add.s(1, 1), group(wf.double.s(), wf.double.s()), wf.double.s()).enqueue()
    assert workflow.cancel() is True
    assert workflow.status == FAILED
    assert workflow.cancel() is False
    run_worker()
    workflow.refresh()
    assert states(workflow) == [FAILED] * 4
    for member in workflow.members:
        assert member.errors[-1].exception_class_path.endswith("TaskCancelled")
        assert not member.worker_ids  # never ran


@pytest.mark.django_db(transaction=True)
def test_a_step_cancelled_on_its_own_moves_the_workflow_on(run_worker: RunWorker) -> None:
    from django_sqltasks.store import control
    from django_sqltasks.store.workflows import reconcile

    workflow = chain(wf.add.s(1, 1), wf.double.s(), wf.double.s()).enqueue()
    parked = TaskRecord.objects.filter(pk=workflow.task_ids[1])
    assert control.cancel(parked, using="default", reason="not wanted")
    run_worker()  # the first step's outcome finds the second cancelled: the chain fails
    workflow.refresh()
    assert workflow.status == FAILED
    assert states(workflow) == [SUCCESSFUL, FAILED, FAILED]
    assert reconcile("default", "default") == 0


def test_the_sweep_moves_on_a_workflow_whose_step_ended_elsewhere() -> None:
    from django_sqltasks.store import control
    from django_sqltasks.store.workflows import reconcile

    workflow = chain(wf.add.s(1, 1), wf.double.s()).enqueue()
    first = TaskRecord.objects.filter(pk=workflow.task_ids[0])
    assert control.cancel(first, using="default", reason="not wanted")  # no worker saw it
    assert reconcile("default", "default") == 1
    workflow.refresh()
    assert workflow.status == FAILED
    assert states(workflow) == [FAILED, FAILED]
    assert reconcile("default", "default") == 0


@pytest.mark.django_db(transaction=True)
def test_a_member_result_names_its_workflow(run_worker: RunWorker) -> None:
    workflow = chain(wf.add.s(1, 1), wf.double.s()).enqueue()
    member = tasks.add.get_backend().get_result(workflow.task_ids[1])
    assert member.workflow_id == workflow.id
    found = workflow_of(member)
    assert found is not None and found.id == workflow.id
    assert workflow_of(tasks.add.enqueue(1, 2)) is None
    assert get_workflow(workflow.id).task_ids == workflow.task_ids
    with pytest.raises(LookupError, match="No workflow 'nope'"):
        get_workflow("nope")


@pytest.mark.django_db(transaction=True)
def test_atomic_task_commits_its_writes_with_its_outcome(
    run_worker: RunWorker, tmp_path: Path
) -> None:
    marker = str(tmp_path / "atomic")
    done = wf.atomic_step.enqueue(None, "atomic-ok", marker)
    failed = wf.atomic_fail.enqueue("atomic-rolled-back")
    run_worker()
    done.refresh()
    failed.refresh()
    assert done.status == SUCCESSFUL and done.return_value == "atomic-ok"
    assert failed.status == FAILED
    assert list(Group.objects.values_list("name", flat=True)) == ["atomic-ok"]


@pytest.mark.django_db(transaction=True)
def test_an_atomic_chain_runs_each_step_once(run_worker: RunWorker, tmp_path: Path) -> None:
    marker = str(tmp_path / "atomic")
    steps = [wf.atomic_step.s(f"s{i}", marker) for i in range(3)]
    workflow = chain(*steps).enqueue(None)
    run_worker()
    workflow.refresh()
    assert workflow.return_value == "s2"
    assert sorted(Group.objects.values_list("name", flat=True)) == ["s0", "s1", "s2"]


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: chain(), TypeError, "chain\\(\\) needs at least one step"),
        (lambda: group(), TypeError, "group\\(\\) needs at least one member"),
        (lambda: chain(wf.add.s(1, 2), 42), TypeError, "chain\\(\\) step 1 must be a task"),
        (lambda: group(wf.add).then(42), TypeError, "then\\(\\) takes a task"),
        (
            lambda: group(wf.add).then(wf.total, on_failure="ignore"),
            ValueError,
            "on_failure must be 'skip' or 'run', not 'ignore'",
        ),
        (lambda: signature("x"), TypeError, "needs a task"),
    ],
)
def test_bad_workflows_are_refused_naming_the_rule(
    build: Callable[[], Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        build()


def test_bad_steps_are_refused_at_enqueue_and_write_nothing() -> None:
    with pytest.raises(InvalidWorkflow, match="deduplicates"):
        chain(wf.add.s(1, 1), signature(tasks.refresh_report, 1)).enqueue()
    with pytest.raises(TypeError, match="not JSON-serializable"):
        chain(wf.add.s(1, {1, 2})).enqueue()
    assert not TaskRecord.objects.exists()
    assert not WorkflowRecord.objects.exists()


def test_an_async_task_cannot_be_atomic() -> None:
    with pytest.raises(InvalidTask, match="atomic=True needs a sync function"):
        dataclasses.replace(tasks.async_add, atomic=True)  # type: ignore[call-arg]
    with pytest.raises(InvalidTask, match="atomic must be True or False, not 1"):
        dataclasses.replace(tasks.add, atomic=1)  # type: ignore[call-arg]


def test_run_tasks_runs_a_workflow_to_its_end() -> None:
    from django_sqltasks.testing import run_tasks

    workflow = chain(
        wf.add.s(1, 1), group(wf.double.s(), wf.double.s()).then(wf.sum_of.s())
    ).enqueue()
    run_tasks(fast_forward=True)
    workflow.refresh()
    assert workflow.return_value == 8


def test_run_now_leaves_a_waiting_step_alone() -> None:
    workflow = chain(wf.add.s(1, 1), wf.double.s()).enqueue()
    backend = wf.add.get_backend()
    assert backend.run_now(workflow.task_ids[1]) is False
    assert TaskRecord.objects.get(pk=workflow.task_ids[1]).available_at == PARKED


@pytest.mark.django_db(transaction=True)
async def test_aenqueue_writes_a_workflow() -> None:
    workflow = await chain(wf.add.s(1, 1), wf.double.s()).aenqueue()
    assert workflow.status == TaskResultStatus.RUNNING
    assert await TaskRecord.objects.filter(workflow_id=workflow.id).acount() == 2
    # The thread that ran the writes keeps its connection; close it before teardown.
    await sync_to_async(connections.close_all)()


@pytest.mark.django_db(transaction=True)
def test_a_deferred_step_waits_for_its_run_after_once_its_turn_comes(
    run_worker: RunWorker,
) -> None:
    later = timezone.now() + timedelta(hours=1)
    workflow = chain(wf.add.s(1, 1), wf.double.using(run_after=later).s()).enqueue()
    run_worker()  # runs the first step; the second is due in an hour
    second = TaskRecord.objects.get(pk=workflow.task_ids[1])
    assert second.status == READY
    assert second.args == [2]
    assert second.available_at == later
