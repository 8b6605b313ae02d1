"""Durable tasks: steps that are not run again, sleeps and waits that hold no worker, events
from outside; through a real worker, on every database."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from django_sqltasks import get_workflow, group, send_event
from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.exceptions import InvalidStep
from django_sqltasks.models import EventRecord, StepRecord, TaskRecord
from django_sqltasks.store import pruning
from django_sqltasks.store.steps import forget
from django_sqltasks.worker import Worker
from tests import tasks_durable, tasks_workflows
from tests.conftest import wait_for, worker_thread
from tests.tasks_durable import effects

pytestmark = pytest.mark.django_db(transaction=True)

RunWorker = Callable[..., Worker]


def row(result: Any) -> TaskRecord:
    return TaskRecord.objects.get(pk=result.id)


def steps(result: Any) -> list[tuple[str, str, int, str, int]]:
    return [
        (s.kind, s.name, s.occurrence, s.state, s.attempts)
        for s in StepRecord.objects.filter(task_id=result.id).order_by("id")
    ]


def wake_now(result: Any) -> None:
    """Date the task's sleep and its wake time into the past: its sleep is over."""
    past = timezone.now() - timedelta(seconds=1)
    StepRecord.objects.filter(task_id=result.id, state="waiting").update(wake_at=past)
    TaskRecord.objects.filter(pk=result.id).update(available_at=past)


# Steps -------------------------------------------------------------------------------------


def test_a_retried_task_does_not_run_its_finished_steps_again(
    run_worker: RunWorker, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    result = tasks_durable.fails_at_third.enqueue(str(log), str(tmp_path / "marker"))
    run_worker()
    record = row(result)
    assert record.status == TaskResultStatus.SUCCESSFUL, record.errors
    assert record.attempts == 2
    # "one" and "two" ran once; "three" raised, and ran again on the retry.
    assert effects(log) == ["one", "two", "three", "three"]
    key = f"{result.id}:two"
    assert record.return_value == ["one", {"key": key, "line": "two"}, "three"]
    assert steps(result) == [
        ("step", "one", 0, "done", 1),
        ("step", "two", 0, "done", 1),
        ("step", "three", 0, "done", 2),
    ]


def test_a_steps_failure_is_recorded_with_its_error(run_worker: RunWorker, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    result = tasks_durable.fails_at_third.enqueue(str(tmp_path / "log"), str(marker))
    # Record only the first attempt: the retry is due in the future.
    TaskRecord.objects.filter(pk=result.id).update(available_at=timezone.now())
    marker.touch()
    marker.unlink()
    run_worker()
    third = StepRecord.objects.get(task_id=result.id, name="three")
    assert third.state == "done" and third.attempts == 2
    assert third.duration is not None and third.duration >= 0


def test_a_repeated_step_name_is_one_step_per_occurrence(
    run_worker: RunWorker, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    result = tasks_durable.repeated.enqueue(str(log), 3)
    run_worker()
    assert row(result).status == TaskResultStatus.SUCCESSFUL
    assert [s[2] for s in steps(result)] == [0, 1, 2]
    assert effects(log) == ["row0", "row1", "row2"]


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("object", "The result of step 'bad'"),
        ("nan", "The result of step 'bad' is nan"),
        ("large", "encodes to 104857602 bytes, over the MAX_PAYLOAD_BYTES"),
    ],
)
def test_a_step_result_that_cannot_be_stored_fails_the_task_alone(
    kind: str, message: str, run_worker: RunWorker
) -> None:
    bad = tasks_durable.returns.using().enqueue(kind)
    good = tasks_durable.plain.enqueue(7)
    run_worker()
    assert row(good).return_value == 7
    record = row(bad)
    assert record.status == TaskResultStatus.FAILED
    assert message in record.errors[-1]["traceback"]
    step = StepRecord.objects.get(task_id=bad.id)
    assert step.state == "failed" and message in step.error


def test_a_step_name_of_10_kb_is_refused(run_worker: RunWorker) -> None:
    bad = tasks_durable.named.enqueue("n" * 10_240)
    run_worker()
    record = row(bad)
    assert record.status == TaskResultStatus.FAILED
    assert (
        "A step name must be 1 to 200 characters long, not 10240"
        in (record.errors[-1]["traceback"])
    )
    assert not StepRecord.objects.exists()


# Sleeps ------------------------------------------------------------------------------------


def test_a_sleeping_task_is_ready_until_its_wake_time_then_goes_on(
    run_worker: RunWorker, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    result = tasks_durable.sleeper.enqueue(str(log), 3 * 86400)
    before = timezone.now()
    run_worker()
    record = row(result)
    assert record.status == TaskResultStatus.READY
    assert record.owner is None and record.attempts == 0 and record.errors == []
    three_days = before + timedelta(days=3)
    assert (
        three_days - timedelta(minutes=1) < record.available_at < three_days + timedelta(minutes=1)
    )
    sleep = StepRecord.objects.get(task_id=result.id, kind="sleep")
    assert sleep.state == "waiting" and sleep.wake_at == record.available_at
    run_worker()  # not due: nothing runs
    assert row(result).status == TaskResultStatus.READY
    wake_now(result)
    run_worker()
    record = row(result)
    assert record.status == TaskResultStatus.SUCCESSFUL
    assert record.return_value == "slept" and record.attempts == 1
    assert effects(log) == ["before", "after"]
    assert len(record.worker_ids) == 2
    assert steps(result) == [
        ("step", "before", 0, "done", 1),
        ("sleep", "sleep", 0, "done", 1),
        ("step", "after", 0, "done", 1),
    ]


def test_a_task_woken_before_its_wake_time_sleeps_again(
    run_worker: RunWorker, tmp_path: Path
) -> None:
    result = tasks_durable.sleeper.enqueue(str(tmp_path / "log"), 3600)
    run_worker()
    wake_at = row(result).available_at
    TaskRecord.objects.filter(pk=result.id).update(available_at=timezone.now())
    run_worker()
    record = row(result)
    assert record.status == TaskResultStatus.READY and record.available_at == wake_at
    assert effects(tmp_path / "log") == ["before"]


@pytest.mark.parametrize(
    ("task", "args", "message"),
    [
        (tasks_durable.sleeps_nan, (), "sleep() seconds must be a finite number of seconds"),
        (
            tasks_durable.sleeps_until,
            ("9999-12-31T00:00:00+00:00",),
            "sleep(until=...) must be at most ten years ahead",
        ),
    ],
)
def test_a_sleep_out_of_bounds_fails_the_task_alone(
    task: Any, args: tuple[Any, ...], message: str, run_worker: RunWorker
) -> None:
    bad = task.enqueue(*args)
    good = tasks_durable.plain.enqueue(1)
    run_worker()
    assert row(good).status == TaskResultStatus.SUCCESSFUL
    record = row(bad)
    assert record.status == TaskResultStatus.FAILED
    assert message in record.errors[-1]["traceback"]


# Events ------------------------------------------------------------------------------------


def test_an_event_sent_after_the_wait_resumes_the_task_with_its_payload(
    run_worker: RunWorker, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    result = tasks_durable.waiter.enqueue(str(log), "order.paid", "42")
    run_worker()
    record = row(result)
    assert record.status == TaskResultStatus.READY and record.attempts == 0
    assert record.available_at.year == 9999  # no timeout: never due by the clock
    assert send_event("order.paid", 42, {"amount": 10}) is True
    assert row(result).available_at <= timezone.now()
    run_worker()
    record = row(result)
    assert record.status == TaskResultStatus.SUCCESSFUL
    assert record.return_value == {"amount": 10}
    assert effects(log) == ["before", "after:42"]
    assert steps(result)[1] == ("event", "order.paid", 0, "done", 1)


def test_an_event_sent_before_the_wait_is_not_lost(run_worker: RunWorker, tmp_path: Path) -> None:
    assert send_event("order.paid", "7", [1, 2]) is True
    result = tasks_durable.waiter.enqueue(str(tmp_path / "log"), "order.paid", "7")
    run_worker()
    record = row(result)
    assert record.status == TaskResultStatus.SUCCESSFUL
    assert record.return_value == [1, 2]
    assert len(record.worker_ids) == 1  # it never stopped


def test_an_event_sent_twice_resumes_the_task_once(run_worker: RunWorker, tmp_path: Path) -> None:
    log = tmp_path / "log"
    result = tasks_durable.waiter.enqueue(str(log), "order.paid", "9")
    run_worker()
    assert send_event("order.paid", "9", "first") is True
    assert send_event("order.paid", "9", "second") is False
    run_worker()
    run_worker()
    record = row(result)
    assert record.return_value == "first"
    assert effects(log) == ["before", "after:9"]
    assert len(record.worker_ids) == 2


def test_an_event_sent_in_a_rolled_back_transaction_resumes_nothing(
    run_worker: RunWorker, tmp_path: Path
) -> None:
    result = tasks_durable.waiter.enqueue(str(tmp_path / "log"), "order.paid", "5")
    run_worker()
    parked = row(result).available_at
    with transaction.atomic():
        assert send_event("order.paid", "5", "lost") is True
        assert row(result).available_at < parked  # woken, in this transaction
        transaction.set_rollback(True)
    assert row(result).available_at == parked
    assert not EventRecord.objects.filter(sent_at__isnull=False).exists()
    run_worker()
    assert row(result).status == TaskResultStatus.READY


def test_a_wait_whose_timeout_passes_resumes_with_the_timeout(
    run_worker: RunWorker, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    result = tasks_durable.waiter.enqueue(str(log), "order.paid", "3", 3600)
    run_worker()
    record = row(result)
    assert timezone.now() + timedelta(minutes=59) < record.available_at
    wake_now(result)
    run_worker()
    record = row(result)
    assert record.status == TaskResultStatus.SUCCESSFUL
    assert record.return_value == {"timed_out": "3"}
    assert steps(result)[1][3] == "timed_out"
    # The event, sent late, is kept for whoever waits next; it wakes nothing.
    assert send_event("order.paid", "3", "late") is True
    assert EventRecord.objects.get(key="3").task_id is None


def test_an_event_goes_to_one_task(run_worker: RunWorker, tmp_path: Path) -> None:
    first = tasks_durable.waits_for_key.enqueue("11")
    run_worker()
    second = tasks_durable.waits_for_key.enqueue("11")
    run_worker()
    record = row(second)
    assert record.status == TaskResultStatus.FAILED
    assert f"is awaited by (or went to) task {first.id}" in record.errors[-1]["traceback"]
    assert row(first).status == TaskResultStatus.READY


def test_a_wait_inside_a_transaction_is_refused(run_worker: RunWorker) -> None:
    result = tasks_durable.waits_in_transaction.enqueue()
    run_worker()
    record = row(result)
    assert record.status == TaskResultStatus.FAILED
    assert "cannot be called inside a transaction" in record.errors[-1]["traceback"]


@pytest.mark.parametrize(
    ("name", "key", "message"),
    [
        ("order.paid", "a\x00b", "The event key contains a NUL character"),
        ("", "1", "The event name must be 1 to 200 characters long, not 0"),
        ("order.paid", "k" * 10_240, "The event key must be 1 to 200 characters long"),
        ("order.paid", None, "The event key must be a string"),
    ],
)
def test_send_event_refuses_bad_names_and_keys(name: str, key: Any, message: str) -> None:
    with pytest.raises(InvalidStep, match=message.replace("(", r"\(").replace(")", r"\)")):
        send_event(name, key)
    assert not EventRecord.objects.exists()


def test_send_event_refuses_a_payload_that_is_not_json() -> None:
    with pytest.raises(InvalidStep, match="The event payload is nan"):
        send_event("order.paid", "1", float("nan"))


# Async -------------------------------------------------------------------------------------


def test_an_async_task_steps_sleeps_and_waits(run_worker: RunWorker, tmp_path: Path) -> None:
    log = tmp_path / "log"
    result = tasks_durable.async_flow.enqueue(str(log), "21")
    run_worker()
    assert row(result).status == TaskResultStatus.READY
    send_event("order.paid", "21", "paid")
    run_worker()
    record = row(result)
    assert record.status == TaskResultStatus.SUCCESSFUL, record.errors
    assert record.return_value == ["charge", "sync", "paid"]
    assert effects(log) == ["charge", "sync"]


def test_pruning_deletes_the_steps_of_deleted_tasks_and_old_unclaimed_events(
    run_worker: RunWorker, tmp_path: Path
) -> None:
    kept = tasks_durable.sleeper.enqueue(str(tmp_path / "log"), 3600)
    deleted = tasks_durable.repeated.enqueue(str(tmp_path / "log"), 2)
    pruned = tasks_durable.repeated.enqueue(str(tmp_path / "log"), 2)
    run_worker()
    TaskRecord.objects.filter(pk=deleted.id).delete()
    forget("default", [row(kept).pk, uuid.UUID(deleted.id)])
    TaskRecord.objects.filter(pk=pruned.id).update(finished_at=timezone.now() - timedelta(days=9))
    send_event("unclaimed", "old")
    send_event("unclaimed", "new")
    EventRecord.objects.filter(key="old").update(sent_at=timezone.now() - timedelta(days=9))
    pruning.prune(using="default", successful_days=1)
    assert set(StepRecord.objects.values_list("task_id", flat=True)) == {row(kept).pk}
    assert list(EventRecord.objects.values_list("key", flat=True)) == ["new"]


# Open batches -------------------------------------------------------------------------------


@pytest.mark.parametrize("fail_once", [False, True])
def test_a_member_adds_members_and_the_callback_waits_for_them(
    fail_once: bool, run_worker: RunWorker, tmp_path: Path
) -> None:
    marker = str(tmp_path / "marker") if fail_once else ""
    workflow = (
        group(tasks_durable.splits.s(4, marker), tasks_durable.count_page.s(10))
        .then(tasks_workflows.sum_of.s())
        .enqueue()
    )
    run_worker()
    result = get_workflow(workflow.id)
    assert result.status == TaskResultStatus.SUCCESSFUL, result.failed_step
    # The callback got every member's result, the late ones after the others'.
    assert result.return_value == 1 + 10 + 2 + 3 + 4
    assert len(result.task_ids) == 6  # 2 members, 3 added (once, even after a retry), 1 callback


def test_a_task_outside_a_group_cannot_add_members(run_worker: RunWorker) -> None:
    result = tasks_durable.adds_alone.enqueue()
    run_worker()
    record = row(result)
    assert record.status == TaskResultStatus.FAILED
    assert "is not a member of a running group" in record.errors[-1]["traceback"]


def test_events_sent_while_their_waits_begin_each_resume_their_task_once(
    tmp_path: Path,
) -> None:
    log = tmp_path / "log"
    count = 60
    results = [tasks_durable.waiter.enqueue(str(log), "race", str(i)) for i in range(count)]
    with worker_thread(Worker(queue_names=["*"], concurrency=8)):
        for i in range(count):  # before, while and after the worker reaches each wait
            assert send_event("race", str(i), i) is True
        wait_for(
            lambda: TaskRecord.objects.filter(status="SUCCESSFUL").count() == count, timeout=120
        )
    values = {str(k): v for k, v in TaskRecord.objects.values_list("id", "return_value")}
    assert [values[str(r.id)] for r in results] == list(range(count))
    resumed = [line for line in effects(log) if line.startswith("after:")]
    assert sorted(resumed) == sorted(f"after:{i}" for i in range(count))
