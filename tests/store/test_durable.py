"""Durable tasks: steps that are not run again, sleeps and waits that hold no worker, events
from outside; through a real worker, on every database."""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_sqltasks import asend_event, get_workflow, group, send_event
from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.core.durable import SentEvent
from django_sqltasks.exceptions import InvalidStep, InvalidTaskArguments, PayloadTooLarge
from django_sqltasks.models import EventRecord, StepRecord, TaskRecord
from django_sqltasks.store import pruning
from django_sqltasks.store.steps import StepRecords, forget
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


def test_a_first_run_reads_no_steps_and_a_later_run_replays_them() -> None:
    """At a task's first claim ever no run can have written a step: the step's one statement
    is its INSERT. A later claim reads the records; a record a first claim did not expect
    (a row whose worker ids were rewritten) still wins over the step's second result."""
    task_id = uuid.uuid4()

    def attempt(claims: int) -> StepRecords:
        owner = f"w{claims}"
        return StepRecords(
            task_id=task_id, owner=owner, attempt=claims, claims=claims, backend_name="default"
        )

    with CaptureQueriesContext(connections["default"]) as queries:
        assert attempt(1).step("one", lambda: 1, (), {}) == 1
    assert [q["sql"].split()[0].upper() for q in queries] == ["INSERT"], queries.captured_queries
    ran: list[int] = []

    def run(value: int) -> int:
        ran.append(value)
        return value

    assert attempt(2).step("one", run, (2,), {}) == 1
    assert ran == []  # replayed from its record
    assert attempt(1).step("one", run, (3,), {}) == 1
    assert ran == [3]  # ran again, unaware, and found the record first stored
    assert StepRecord.objects.filter(task_id=task_id).count() == 1


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


SECONDS = "must be a finite number of seconds from 0 to 3.16224e+08 (ten years), not"


@pytest.mark.parametrize(
    ("call", "kind", "message"),
    [
        ("step name", "10kb", "A step name must be 1 to 200 characters long, not 10240."),
        ("step name", "nul", "A step name contains a NUL character (\\x00)"),
        ("step name", "surrogate", "A step name contains a lone surrogate ('\\ud800')"),
        ("step result", "surrogate", "The result of step 'bad' contains a lone surrogate"),
        ("step result", "huge_int", "The result of step 'bad' is an integer outside the signed"),
        ("step result", "1e300", "The result of step 'bad' is 1e+300, a float of magnitude 2**63"),
        ("sleep", "nan", f"sleep() seconds {SECONDS} nan."),
        ("sleep", "inf", f"sleep() seconds {SECONDS} inf."),
        ("sleep", "1e300", f"sleep() seconds {SECONDS} 1e+300."),
        ("sleep", "-1", f"sleep() seconds {SECONDS} -1."),
        ("sleep", "-1 day", f"sleep() seconds {SECONDS} -86400.0."),
        ("sleep until", "naive 9999", "sleep(until=...) must be at most ten years ahead, not 9999"),
        ("sleep until", "not a time", "sleep(until=...) must be a datetime, not 'tomorrow'."),
        ("sleep name", "10kb", "A sleep name must be 1 to 200 characters long, not 10240."),
        ("timeout", "nan", f"timeout {SECONDS} nan."),
        ("timeout", "inf", f"timeout {SECONDS} inf."),
        ("timeout", "1e300", f"timeout {SECONDS} 1e+300."),
        ("timeout", "-1", f"timeout {SECONDS} -1."),
        ("event name", "10kb", "The event name must be 1 to 200 characters long, not 10240."),
        ("event key", "nul", "The event key contains a NUL character (\\x00)"),
        ("event key", "surrogate", "The event key contains a lone surrogate ('\\ud800')"),
        ("event key", "10kb", "The event key must be 1 to 200 characters long, not 10240."),
    ],
)
def test_a_hostile_durable_call_fails_its_task_alone_naming_the_rule(
    call: str, kind: str, message: str, run_worker: RunWorker, tmp_path: Path
) -> None:
    waiting = tasks_durable.waiter.enqueue(str(tmp_path / "log"), "order.paid", "other")
    bad = tasks_durable.hostile.enqueue(call, kind)
    good = tasks_durable.plain.enqueue(7)
    run_worker()
    record = row(bad)
    assert record.status == TaskResultStatus.FAILED
    assert record.errors[-1]["exception_class_path"] == "django_sqltasks.exceptions.InvalidStep"
    assert message in record.errors[-1]["traceback"], record.errors[-1]["traceback"]
    # Nothing was stored for it but a failed step's record; the other tasks go on.
    assert [s[3] for s in steps(bad)] == (["failed"] if call == "step result" else [])
    assert row(good).return_value == 7
    assert row(waiting).status == TaskResultStatus.READY
    assert send_event("order.paid", "other", "ok") == SentEvent.RESUMED
    run_worker()
    assert row(waiting).return_value == "ok"


def test_a_task_written_for_a_context_not_declared_with_takes_context_says_so(
    run_worker: RunWorker,
) -> None:
    result = tasks_durable.forgets_context.enqueue()
    run_worker()
    record = row(result)
    assert record.status == TaskResultStatus.FAILED
    text = record.errors[-1]["traceback"]
    assert "'NoneType' object has no attribute 'step'" in text, text
    assert "not declared with takes_context=True" in text, text
    # Enqueued as if the worker passed the context: refused at once, with the same hint.
    with pytest.raises(InvalidTaskArguments, match=r"missing a required argument: 'order_id'"):
        tasks_durable.forgets_context_for.enqueue(7)  # type: ignore[call-arg]
    with pytest.raises(InvalidTaskArguments, match=r"declare it @task\(takes_context=True\)"):
        tasks_durable.forgets_context_for.enqueue(7)  # type: ignore[call-arg]


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
    assert send_event("order.paid", 42, {"amount": 10}) == SentEvent.RESUMED
    assert row(result).available_at <= timezone.now()
    run_worker()
    record = row(result)
    assert record.status == TaskResultStatus.SUCCESSFUL
    assert record.return_value == {"amount": 10}
    assert effects(log) == ["before", "after:42"]
    assert steps(result)[1] == ("event", "order.paid", 0, "done", 1)


def test_a_cancelled_waiter_lets_its_key_go_and_the_sender_is_told(
    run_worker: RunWorker, tmp_path: Path
) -> None:
    """A waiter cancelled before its event came: the send says its waiter is gone and keeps the
    payload, and a new task waiting for the key takes it (it failed EventAlreadyAwaited,
    naming the cancelled task, until that task was deleted)."""
    log = str(tmp_path / "log")
    first = tasks_durable.waiter.enqueue(log, "order.paid", "77")
    run_worker()  # it waits
    assert tasks_durable.waiter.get_backend().cancel(first.id)
    assert row(first).status == TaskResultStatus.FAILED
    assert send_event("order.paid", "77", "paid") == SentEvent.WAITER_GONE
    again = tasks_durable.waiter.enqueue(log, "order.paid", "77")
    run_worker()
    record = row(again)
    assert record.status == TaskResultStatus.SUCCESSFUL and record.return_value == "paid"
    assert send_event("order.paid", "77", "twice") == SentEvent.ALREADY_SENT


def test_a_key_whose_waiter_was_cancelled_is_awaited_again_before_its_event(
    run_worker: RunWorker, tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    first = tasks_durable.waiter.enqueue(log, "order.paid", "78")
    run_worker()
    tasks_durable.waiter.get_backend().cancel(first.id)
    again = tasks_durable.waiter.enqueue(log, "order.paid", "78")
    run_worker()  # it waits, where it failed EventAlreadyAwaited
    assert row(again).status == TaskResultStatus.READY
    assert send_event("order.paid", "78", "paid") == SentEvent.RESUMED
    run_worker()
    assert row(again).return_value == "paid"


def test_a_key_whose_waiter_took_its_event_stays_its_own(
    run_worker: RunWorker, tmp_path: Path
) -> None:
    """An event that went to its task is not handed to the next: a second waiter for the key
    fails EventAlreadyAwaited, as before."""
    log = str(tmp_path / "log")
    first = tasks_durable.waiter.enqueue(log, "order.paid", "79")
    assert send_event("order.paid", "79", "paid") == SentEvent.STORED
    run_worker()
    assert row(first).status == TaskResultStatus.SUCCESSFUL
    second = tasks_durable.waiter.enqueue(log, "order.paid", "79")
    run_worker()
    record = row(second)
    assert record.status == TaskResultStatus.FAILED
    assert "EventAlreadyAwaited" in record.errors[-1]["exception_class_path"]


def test_an_event_sent_before_the_wait_is_not_lost(run_worker: RunWorker, tmp_path: Path) -> None:
    assert send_event("order.paid", "7", [1, 2]) == SentEvent.STORED
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
    assert send_event("order.paid", "9", "first") == SentEvent.RESUMED
    assert send_event("order.paid", "9", "second") == SentEvent.ALREADY_SENT
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
        assert send_event("order.paid", "5", "lost") == SentEvent.RESUMED
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
    assert (
        send_event("order.paid", "3", "late") == SentEvent.STORED
    )  # the wait timed out: kept for the next
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
        ("order.paid", "a\ud800", "The event key contains a lone surrogate ('\\ud800')"),
        ("a\ud800", "1", "The event name contains a lone surrogate ('\\ud800')"),
    ],
)
def test_send_event_refuses_bad_names_and_keys(name: str, key: Any, message: str) -> None:
    with pytest.raises(InvalidStep, match=re.escape(message)):
        send_event(name, key)
    assert not EventRecord.objects.exists()


@pytest.mark.parametrize(
    ("payload", "error", "message"),
    [
        (float("nan"), InvalidStep, "The event payload is nan, which JSON cannot represent."),
        ({"a": math.inf}, InvalidStep, "The event payload['a'] is inf, which JSON cannot"),
        ([1e300], InvalidStep, "The event payload[0] is 1e+300, a float of magnitude 2**63 or"),
        ("a\ud800", InvalidStep, "The event payload contains a lone surrogate ('\\ud800')"),
        (object(), InvalidStep, "Unsupported type: The event payload is a builtins.object"),
        ("x" * (100 * 1024 * 1024), PayloadTooLarge, "The event payload encodes to 104857602"),
    ],
)
def test_send_event_refuses_a_payload_it_cannot_store(
    payload: Any, error: type[Exception], message: str, run_worker: RunWorker, tmp_path: Path
) -> None:
    result = tasks_durable.waiter.enqueue(str(tmp_path / "log"), "order.paid", "1")
    run_worker()
    with transaction.atomic():
        good = tasks_durable.plain.enqueue(1)
        with pytest.raises(error) as raised:
            send_event("order.paid", "1", payload)
    assert message in str(raised.value)
    # The sender's transaction committed its other writes; the waiting task still waits.
    assert not EventRecord.objects.filter(sent_at__isnull=False).exists()
    run_worker()
    assert row(good).status == TaskResultStatus.SUCCESSFUL
    assert row(result).status == TaskResultStatus.READY


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


async def test_asend_event_from_async_code_resumes_a_task_aenqueue_queued(
    run_worker: RunWorker, tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    waits = await tasks_durable.waiter.aenqueue(log, "order.paid", "31")
    found = await tasks_durable.waiter.aenqueue(log, "order.paid", "32")
    # Before its wait began: kept for it.
    assert await asend_event("order.paid", "32", "early") == SentEvent.STORED
    await sync_to_async(run_worker)()
    assert await asend_event("order.paid", "31", "paid") == SentEvent.RESUMED
    assert await asend_event("order.paid", "31", "again") == SentEvent.ALREADY_SENT
    with pytest.raises(InvalidStep, match="The event key contains a NUL character"):
        await asend_event("order.paid", "3\x001")
    await sync_to_async(run_worker)()
    await waits.arefresh()
    await found.arefresh()
    assert (waits.status, waits.return_value) == (TaskResultStatus.SUCCESSFUL, "paid")
    assert (found.status, found.return_value) == (TaskResultStatus.SUCCESSFUL, "early")
    assert sorted(effects(log)) == ["after:31", "after:32", "before", "before"]
    # The thread that ran the queries keeps its connection; close it before teardown.
    await sync_to_async(connections.close_all)()


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
    pruning.prune(using="default", successful_days=1, backend="default")
    assert set(StepRecord.objects.values_list("task_id", flat=True)) == {row(kept).pk}
    # Unclaimed events have a retention of their own: the tasks' leaves them.
    assert EventRecord.objects.filter(task_id__isnull=True).count() == 2
    pruning.prune(using="default", successful_days=1, backend="default", unclaimed_event_days=1)
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
            assert send_event("race", str(i), i) in (SentEvent.RESUMED, SentEvent.STORED)
        wait_for(
            lambda: TaskRecord.objects.filter(status="SUCCESSFUL").count() == count, timeout=120
        )
    values = {str(k): v for k, v in TaskRecord.objects.values_list("id", "return_value")}
    assert [values[str(r.id)] for r in results] == list(range(count))
    resumed = [line for line in effects(log) if line.startswith("after:")]
    assert sorted(resumed) == sorted(f"after:{i}" for i in range(count))
