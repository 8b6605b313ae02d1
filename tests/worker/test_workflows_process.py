"""Workflows under real worker processes that get killed, and under two workers racing to
finish a group's last two members."""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest
from django.contrib.auth.models import Group
from django.db import connections
from django.utils import timezone

from django_sqltasks import chain, group, signature
from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.core.workflows import WorkflowResult, get_workflow
from django_sqltasks.models import TaskRecord
from django_sqltasks.sql import Outcome, dialect_for
from django_sqltasks.sql.rows import PARKED
from django_sqltasks.store.workflows import SKIPPED, complete
from tests import tasks_processes
from tests import tasks_workflows as wf
from tests.conftest import WorkerProcess, expire_lease
from tests.events import EventLog

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker_process]

StartWorker = Callable[..., WorkerProcess]
# A killed worker's lease is expired by the test (expire_lease), not waited out.
BEAT = {"SQLTASKS_HEARTBEAT_INTERVAL": "0.25"}
WORKER_LOST = "django_sqltasks.exceptions.WorkerLost"


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def finish(workflow: WorkflowResult, events: EventLog, *workers: WorkerProcess) -> WorkflowResult:
    """Wait for ``workflow`` to end (looked at after each event of the workers), then stop
    ``workers``; return it as stored."""
    events.until(lambda: get_workflow(workflow.id).is_finished, "the workflow to finish")
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.output
    workflow.refresh()
    return workflow


def rescued(workflow: WorkflowResult) -> set[str]:
    """The ids of the workflow's tasks that lost their worker at least once."""
    return {
        member.id
        for member in workflow.members
        if any(e.exception_class_path == WORKER_LOST for e in member.errors)
    }


def test_sigkill_mid_chain_loses_no_step_and_runs_none_twice_but_the_killed_one(
    worker_process: StartWorker, events: EventLog, tmp_path: Path
) -> None:
    marker = tmp_path / "runs"
    names = [f"s{i}" for i in range(6)]
    steps = (wf.step.s(name, str(marker), hold=name == "s2") for name in names)
    workflow = chain(*steps).enqueue(None)
    victim = worker_process("--concurrency", "2", "--worker-id", "victim", env=BEAT)
    events.wait("note", line="s2")  # s2 is running: its first run holds after its line
    victim.kill()
    victim.wait()
    expire_lease("victim")
    rescuer = worker_process("--concurrency", "2", "--worker-id", "rescuer", env=BEAT)
    workflow = finish(workflow, events, rescuer)
    assert workflow.status == TaskResultStatus.SUCCESSFUL, workflow.plan
    assert workflow.return_value == "s5"
    runs = lines(marker)
    killed = rescued(workflow)
    assert killed == {workflow.task_ids[2]}
    assert [runs.count(name) for name in names] == [1, 1, 2, 1, 1, 1]


def test_sigkill_mid_group_fires_the_callback_once(
    worker_process: StartWorker, events: EventLog, tmp_path: Path
) -> None:
    marker = tmp_path / "runs"
    members = [wf.record.s(f"m{i}", str(marker), 0.3) for i in range(12)]
    workflow = group(*members).then(wf.record_results.s(str(marker))).enqueue()
    victim = worker_process("--concurrency", "3", "--worker-id", "victim", env=BEAT)
    other = worker_process("--concurrency", "3", "--worker-id", "other", env=BEAT)
    events.wait("note", count=5)
    victim.kill()
    victim.wait()
    expire_lease("victim")  # the other worker's next heartbeat rescues its tasks
    workflow = finish(workflow, events, other)
    assert workflow.status == TaskResultStatus.SUCCESSFUL, workflow.plan
    assert workflow.return_value == 12
    runs = lines(marker)
    assert runs.count("callback") == 1
    killed = rescued(workflow)
    for member in workflow.members[:-1]:
        count = runs.count(member.args[0])
        assert count == 1 or (count == 2 and member.id in killed), (member.args, count)
        assert member.status == TaskResultStatus.SUCCESSFUL


def test_sigkill_mid_atomic_step_leaves_none_of_its_writes(
    worker_process: StartWorker, events: EventLog, tmp_path: Path
) -> None:
    marker = tmp_path / "runs"
    names = [f"a{i}" for i in range(4)]
    steps = [wf.atomic_step.s(name, str(marker), hold=name == "a1") for name in names]
    workflow = chain(*steps).enqueue(None)
    victim = worker_process("--concurrency", "2", "--worker-id", "victim", env=BEAT)
    events.wait("note", line="a1")  # a1 has written its row, uncommitted, and holds
    victim.kill()
    victim.wait()
    assert not Group.objects.filter(name="a1").exists()
    expire_lease("victim")
    rescuer = worker_process("--concurrency", "2", "--worker-id", "rescuer", env=BEAT)
    workflow = finish(workflow, events, rescuer)
    assert workflow.status == TaskResultStatus.SUCCESSFUL, workflow.plan
    # The killed attempt ran (its line is there twice) but left no row: Group names are
    # unique, so a row it had committed would have failed the rescued attempt.
    assert [lines(marker).count(name) for name in names] == [1, 2, 1, 1]
    assert sorted(Group.objects.values_list("name", flat=True)) == names
    assert rescued(workflow) == {workflow.task_ids[1]}


def store_outcome(
    workflow_id: str, task_id: str, number: int, barrier: threading.Barrier
) -> BaseException | None:
    """As worker ``w<number>``: store a SUCCESSFUL outcome of ``task_id`` (a step of
    ``workflow_id``) on this thread's own connection, once ``barrier`` lets every thread go."""
    connection = connections["default"]
    outcome = Outcome(
        id=uuid.UUID(task_id),
        status=TaskResultStatus.SUCCESSFUL,
        finished_at=timezone.now(),
        return_value=str(number + 1),
        workflow_id=uuid.UUID(workflow_id),
    )
    worker_id = f"w{number}"
    try:
        barrier.wait()
        with connection.cursor() as cursor:
            dialect = dialect_for(connection)
            write = partial(dialect.complete, cursor, worker_id, [outcome])
            complete("default", [outcome], write)
    except BaseException as e:
        return e
    finally:
        connection.close()
    return None


@pytest.mark.worker_process_core
def test_two_workers_finishing_the_last_two_members_at_once_fire_one_callback() -> None:
    """Each round, two threads (two connections) store the outcomes of a group's last two
    members at the same instant; the callback is made due once, with both results."""
    for _ in range(10):
        workflow = group(wf.add.s(1, 1), wf.add.s(2, 2)).then(wf.sum_of.s()).enqueue()
        members = workflow.task_ids[:2]
        for number, task_id in enumerate(members):
            TaskRecord.objects.filter(pk=task_id).update(
                status=TaskResultStatus.RUNNING, owner=f"w{number}"
            )
        barrier = threading.Barrier(2)
        with ThreadPoolExecutor(2) as pool:
            futures = [
                pool.submit(store_outcome, workflow.id, task_id, number, barrier)
                for number, task_id in enumerate(members)
            ]
            errors = [f.result(timeout=30) for f in futures]
        assert errors == [None, None]
        workflow.refresh()
        callback = TaskRecord.objects.get(pk=workflow.task_ids[2])
        assert callback.available_at < PARKED
        assert callback.args == [[1, 2]]
        # Both outcomes are in the plan: the second writer read the first's, under its lock.
        assert [m["state"] for m in workflow.plan["members"]] == ["SUCCESSFUL"] * 2
        assert workflow.plan["then"]["state"] == "RUNNING"


def test_a_step_killed_past_its_timeout_ends_its_chain(
    worker_process: StartWorker, events: EventLog, tmp_path: Path
) -> None:
    """Under --processes, the supervisor fails a step past its timeout itself, outside any
    worker's outcome write: the workers' sweep moves the chain on."""
    marker = tmp_path / "marker"
    stuck = signature(tasks_processes.sleep_past_timeout, str(marker), 30)
    workflow = chain(stuck, wf.double.s()).enqueue()
    fast = {"SQLTASKS_LEASE_TIMEOUT": "2", "SQLTASKS_HEARTBEAT_INTERVAL": "0.25"}
    supervisor = worker_process("--processes", "1", "-c", "2", env=fast)
    workflow = finish(workflow, events, supervisor)
    assert workflow.status == TaskResultStatus.FAILED
    timed_out, skipped = workflow.members
    assert [e.exception_class_path for e in timed_out.errors] == [
        "django_sqltasks.exceptions.TaskTimeout"
    ]
    assert [e.exception_class_path for e in skipped.errors] == [SKIPPED]
    assert workflow.failed_step is not None
    assert workflow.failed_step["error"] == "django_sqltasks.exceptions.TaskTimeout"
