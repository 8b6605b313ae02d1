"""A durable task's writes against faults: its connection lost at each stage (a step's record,
a park, an event read, a group add), before the statement or after its commit went unheard;
a park by an attempt that no longer holds its task; SQLite's group add beside step writers.
(A real server restart at each stage: tests/worker/test_faults.py.)"""

from __future__ import annotations

import logging
import sqlite3
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections
from django.db.models import F
from django.utils import timezone

from django_sqltasks import get_workflow, group, send_event
from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.core.durable import SentEvent
from django_sqltasks.exceptions import Suspended
from django_sqltasks.models import StepRecord, TaskRecord
from django_sqltasks.store.waits import AttemptSteps
from django_sqltasks.worker import Worker
from tests import tasks_durable, tasks_workflows
from tests.conftest import wait_for, worker_thread
from tests.factories import task_row
from tests.lost_connections import STATEMENTS, lost_at
from tests.tasks_durable import effects

pytestmark = pytest.mark.django_db(transaction=True)

STAGES = list(STATEMENTS)
killable = pytest.mark.skipif(
    connection.vendor == "sqlite", reason="an SQLite connection cannot be lost"
)


def assert_rode_out(log: Path, stages: list[str]) -> None:
    """Every task ended SUCCESSFUL (the group's callback with every member's result, the
    added member once), every step's side effect happened once, and no record was written
    twice."""
    statuses = Counter(TaskRecord.objects.values_list("status", flat=True))
    assert statuses == {TaskResultStatus.SUCCESSFUL: TaskRecord.objects.count()}, statuses
    assert sorted(effects(log)) == sorted(f"{n}:{s}" for s in stages for n in ("one", "two"))
    assert list(StepRecord.objects.filter(attempts__gt=1).values_list("name", "attempts")) == []
    # Each task's records, each done: step "one", the sleep, the wait (and the add), "two".
    records = Counter(StepRecord.objects.filter(state="done").values_list("name", flat=True))
    added = 1 if "group" in stages else 0
    assert records == {
        "one": len(stages), "sleep": len(stages), "lost": len(stages), "two": len(stages),
        **({"add_to_group": added} if added else {}),
    }  # fmt: skip
    assert not StepRecord.objects.exclude(state="done").exists()
    if "group" in stages:
        (workflow,) = set(TaskRecord.objects.values_list("workflow_id", flat=True))
        result = get_workflow(workflow)
        assert result.return_value == 1 + 10 + 2
        assert len(result.task_ids) == 4  # two members, the one added (once), the callback


def run_until_finished(count: int) -> None:
    with worker_thread(Worker(queue_names=["*"], concurrency=4)):
        wait_for(lambda: TaskRecord.objects.filter(finished_at__isnull=False).count() == count)


@killable
@pytest.mark.parametrize(
    ("stage", "when"),
    [
        *((stage, when) for stage in STAGES for when in ("before", "after")),
        # The record written in the stage's transaction, whose commit then never arrived:
        # the try again writes it (and makes the add) again, not taking it as done.
        ("event", "uncommitted"),
        ("group", "uncommitted"),
    ],
)
def test_a_lost_connection_costs_a_durable_task_time_not_the_task(
    stage: str, when: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With max_attempts=1: lost before the write (nothing committed), after its commit (the
    write is in, its client never heard), or before the commit of a write the client saw go
    through, the task's thread reconnects and goes on."""
    log = tmp_path / "log"
    tasks_durable.enqueue_losing(str(log), stage, when)
    with caplog.at_level(logging.WARNING, logger="django_sqltasks"):
        run_until_finished(4 if stage == "group" else 1)
    assert_rode_out(log, [stage])
    retries = [r.getMessage() for r in caplog.records if getattr(r, "action", "") == "db_retry"]
    assert any("in task id=" in m for m in retries), "the fault did not meet the task's write"


# A park guarded by the claim it ends ------------------------------------------------------


@pytest.fixture
def claimed_twice() -> TaskRecord:
    """A task its worker claimed a second time (its second attempt): RUNNING by w1."""
    return task_row(
        TaskResultStatus.RUNNING,
        task_path="tests.tasks_durable.sleeper",
        attempts=2,
        worker_ids=["w1", "w1"],
    )


def attempt_steps(record: TaskRecord, attempt: int, claims: int) -> AttemptSteps:
    return AttemptSteps(
        task_id=record.pk, owner="w1", attempt=attempt, claims=claims, backend_name="default"
    )


@pytest.mark.parametrize(
    ("attempt", "claims", "parks"),
    [
        (2, 2, True),  # the attempt holding the task
        (1, 2, False),  # the first attempt, whose timeout fired, still running on its thread
        (2, 1, False),  # an attempt whose park committed: the claim after has its number
    ],
)
def test_a_park_is_refused_to_an_attempt_that_no_longer_holds_the_task(
    claimed_twice: TaskRecord, attempt: int, claims: int, parks: bool
) -> None:
    steps = attempt_steps(claimed_twice, attempt, claims)
    with pytest.raises(Suspended) as stopped:
        steps.sleep("sleep", 3600, None)
    record = TaskRecord.objects.get(pk=claimed_twice.pk)
    sleeps = StepRecord.objects.filter(task_id=claimed_twice.pk, kind="sleep")
    if parks:
        assert (record.status, record.owner, record.attempts) == ("READY", None, 1)
        assert [s.state for s in sleeps] == ["waiting"]
    else:
        assert "no longer held by this worker" in stopped.value.reason
        assert (record.status, record.owner, record.attempts) == ("RUNNING", "w1", 2)
        assert not sleeps.exists()


def claim_again(task_id: uuid.UUID) -> Callable[[], None]:
    """What the worker's next claim of the task writes (the park gave its attempt back)."""

    def claim() -> None:
        task = TaskRecord.objects.get(pk=task_id)
        TaskRecord.objects.filter(pk=task_id, status="READY").update(
            status="RUNNING",
            owner="w1",
            attempts=F("attempts") + 1,
            worker_ids=[*task.worker_ids, "w1"],
            last_attempted_at=timezone.now(),
        )

    return claim


@killable
@pytest.mark.parametrize("call", ["sleep", "wait"])
def test_a_park_whose_commit_went_unheard_is_not_made_again_under_the_next_claim(
    claimed_twice: TaskRecord, call: str
) -> None:
    """The park committed, its client never heard, and the worker claimed the task again (a
    wait's event came meanwhile): the try again finds the claim is no longer its own, and
    neither parks the next run's task nor takes the event from it."""
    steps = attempt_steps(claimed_twice, 2, 2)
    key = str(claimed_twice.pk)
    claim = claim_again(claimed_twice.pk)

    def claimed_and_sent() -> None:
        claim()
        assert send_event("order.paid", key, "paid") == SentEvent.RESUMED

    if call == "sleep":
        stage, then, stop = "park", claim, lambda: steps.sleep("sleep", 3600, None)
    else:
        stage, then = "event", claimed_and_sent
        stop = lambda: steps.wait_for_event("order.paid", key, None)  # noqa: E731
    with lost_at(stage, "after", then=then), pytest.raises(Suspended) as stopped:
        stop()
    assert "no longer held by this worker" in stopped.value.reason
    record = TaskRecord.objects.get(pk=claimed_twice.pk)
    assert (record.status, record.attempts, len(record.worker_ids)) == ("RUNNING", 2, 3)
    # The park's record, once; a wait's not met by the lost attempt's try again.
    assert list(
        StepRecord.objects.filter(task_id=claimed_twice.pk).values_list("kind", "state")
    ) == [("sleep" if call == "sleep" else "event", "waiting")]


# SQLite's group add beside step writers ---------------------------------------------------


@pytest.fixture
def step_writer() -> Iterator[sqlite3.Connection]:
    """Another connection to the SQLite file, as another task's thread: it writes a step's
    record without waiting for a lock held by another (busy timeout 0)."""
    raw = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, timeout=0)
    try:
        yield raw
    finally:
        raw.close()


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's single writer")
def test_a_group_add_on_sqlite_holds_the_write_lock_from_its_start(
    step_writer: sqlite3.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """Another task records a step between the add's first read and its first write: had the
    add's transaction begun deferred, its write would then fail at once ("database is
    locked", whatever the busy timeout). It began with the write lock: the step writer is
    the one kept waiting, and the add goes through in one try."""
    workflow = group(tasks_durable.count_page.s(1)).then(tasks_workflows.sum_of.s()).enqueue()
    member = TaskRecord.objects.get(workflow_id=workflow.id, task_path__endswith="count_page")
    TaskRecord.objects.filter(pk=member.pk).update(
        status="RUNNING", owner="w1", attempts=1, worker_ids=["w1"]
    )
    steps = attempt_steps(member, 1, 1)
    other = uuid.uuid4().hex
    refused: list[str] = []
    table = StepRecord._meta.db_table

    def another_step(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if not refused and "workflow_id" in sql and sql.lstrip().startswith("SELECT"):
            try:  # the add has read the task's workflow; another thread records a step
                step_writer.execute(
                    f"INSERT INTO {table} (task_id, kind, name, occurrence, state, attempts, "
                    "error, started_at) VALUES (?, 'step', 'x', 0, 'done', 1, '', ?)",
                    [other, timezone.now().isoformat()],
                )
                refused.append("")
            except sqlite3.OperationalError as e:
                refused.append(str(e))
        return result

    with (
        caplog.at_level(logging.INFO, logger="django_sqltasks"),  # a lock conflict's is INFO
        connections["default"].execute_wrapper(another_step),
    ):
        added = steps.add_to_group([tasks_durable.count_page.s(2)])
    assert refused == ["database is locked"], "the add began without the write lock"
    assert [r.getMessage() for r in caplog.records if getattr(r, "action", "") == "db_retry"] == []
    assert len(added) == 1
    assert len(get_workflow(workflow.id).task_ids) == 3  # the member, the one added, callback
