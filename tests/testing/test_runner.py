"""run_tasks() and advance(): due tasks run in the test's process, as a worker runs them."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus, task_finished, task_started
from django_sqltasks.exceptions import TaskTimeout
from django_sqltasks.models import TaskRecord
from django_sqltasks.testing import RunawayTasks, advance, run_tasks
from tests import tasks, tasks_tools
from tests.factories import task_row

pytestmark = pytest.mark.django_db(transaction=False)


def error_classes(result: Any) -> list[str]:
    return [e.exception_class_path for e in result.errors]


def test_runs_due_tasks_inside_the_test_transaction() -> None:
    # The task reads a row only this test's transaction can see.
    user = User.objects.create(username="ada")
    enqueued = tasks_tools.username.enqueue(user.pk)
    [result] = run_tasks()
    assert result.id == enqueued.id
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "ada"
    assert result.attempts == 1
    assert run_tasks() == []


def test_sync_and_async_tasks_and_the_signals() -> None:
    seen: list[tuple[str, str]] = []

    def started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(("started", task_result.id))

    def finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(("finished", task_result.id))

    task_started.connect(started)
    task_finished.connect(finished)
    try:
        a = tasks.add.enqueue(1, 2)
        b = tasks.async_add.enqueue(3, 4)
        results = {r.id: r for r in run_tasks()}
    finally:
        task_started.disconnect(started)
        task_finished.disconnect(finished)
    assert results[a.id].return_value == 3
    assert results[b.id].return_value == 7
    assert sorted(seen) == sorted(
        [("started", a.id), ("finished", a.id), ("started", b.id), ("finished", b.id)]
    )


def test_priority_order_and_tasks_enqueued_by_tasks() -> None:
    low = tasks.add.enqueue(1, 1)
    high = tasks.add.using(priority=10).enqueue(2, 2)
    parent = tasks_tools.parent.enqueue([41])
    results = run_tasks()
    assert [r.id for r in results][:1] == [high.id]
    assert {low.id, parent.id} <= {r.id for r in results}
    [child] = [r for r in results if r.task.name == "add_one"]
    assert child.return_value == 42


def test_a_deferred_task_waits_for_the_clock() -> None:
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 2)
    assert run_tasks() == []
    advance(timedelta(minutes=59))
    assert run_tasks() == []
    advance(61)
    [result] = run_tasks()
    assert result.id == later.id
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_fast_forward_runs_deferred_tasks_and_retries_after_backoff() -> None:
    later = tasks.add.using(run_after=timezone.now() + timedelta(days=2)).enqueue(1, 2)
    failing = tasks_tools.fails_with_backoff.enqueue()
    results = {r.id: r for r in run_tasks(fast_forward=True)}
    assert results[later.id].status == TaskResultStatus.SUCCESSFUL
    assert results[failing.id].status == TaskResultStatus.FAILED
    assert results[failing.id].attempts == 3
    assert error_classes(results[failing.id]) == ["builtins.ConnectionError"] * 3


def test_a_retry_waits_out_its_backoff_on_the_clock() -> None:
    failing = tasks_tools.fails_with_backoff.enqueue()
    assert run_tasks() == []  # the first attempt failed; the retry is 30 to 60 s away
    row = TaskRecord.objects.get(id=failing.id)
    assert row.status == TaskResultStatus.READY
    assert row.attempts == 1
    assert timezone.now() + timedelta(seconds=29) < row.available_at
    advance(60)
    assert run_tasks() == []
    assert TaskRecord.objects.get(id=failing.id).attempts == 2


def test_retries_without_backoff_run_at_once(tmp_path: Path) -> None:
    path = str(tmp_path / "calls")
    result = tasks.flaky.enqueue(path, 2)
    [finished] = run_tasks()
    assert finished.id == result.id
    assert finished.status == TaskResultStatus.SUCCESSFUL
    assert finished.return_value == 3
    assert error_classes(finished) == ["builtins.ConnectionError"] * 2


def test_retry_on_is_honoured(tmp_path: Path) -> None:
    [finished] = (tasks.fails_without_retry.enqueue(str(tmp_path / "c")), run_tasks())[1]
    assert finished.status == TaskResultStatus.FAILED
    assert finished.attempts == 1


def test_timeouts_as_the_worker_records_them() -> None:
    sync = tasks.slow_sync.enqueue(0.5)
    late_error = tasks_tools.overruns_and_raises.enqueue()
    asynchronous = tasks.slow_async.enqueue(30)
    results = {r.id: r for r in run_tasks()}
    timeout_path = f"{TaskTimeout.__module__}.{TaskTimeout.__qualname__}"
    for result in (sync, late_error, asynchronous):
        assert results[result.id].status == TaskResultStatus.FAILED
        assert error_classes(results[result.id]) == [timeout_path]
    assert tasks.slow_sync.enqueue(0.01) and run_tasks()[0].return_value == "finished"


def test_dedupe_holds_until_the_task_ran() -> None:
    first = tasks.refresh_report.enqueue(3)
    assert tasks.refresh_report.enqueue(3).id == first.id
    run_tasks()
    assert tasks.refresh_report.enqueue(3).id != first.id


def test_failures_are_stored_as_the_worker_stores_them() -> None:
    failed = tasks.fail.enqueue("boom")
    not_json = tasks.return_not_json.enqueue()
    missing = task_row(task_path="tests.tasks.no_such_task")
    results = {r.id: r for r in run_tasks()}
    assert error_classes(results[failed.id]) == ["builtins.ValueError"]
    assert "boom" in results[failed.id].errors[0].traceback
    assert error_classes(results[not_json.id]) == ["django_sqltasks.exceptions.InvalidReturnValue"]
    assert error_classes(results[str(missing.id)]) == ["django_sqltasks.exceptions.TaskNotFound"]


def test_queues_limit_the_run() -> None:
    other = tasks.add.using(queue_name="other").enqueue(1, 1)
    default = tasks.add.enqueue(2, 2)
    assert [r.id for r in run_tasks(queues=["other"])] == [other.id]
    assert [r.id for r in run_tasks(queues=["*"])] == [default.id]


def test_the_available_at_of_other_rows_is_left_as_it_was() -> None:
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 2)
    before = TaskRecord.objects.get(id=later.id).available_at
    done = tasks.add.enqueue(3, 4)
    done_at = TaskRecord.objects.get(id=done.id).available_at
    run_tasks()
    assert TaskRecord.objects.get(id=later.id).available_at == before
    assert TaskRecord.objects.get(id=done.id).available_at == done_at


def test_a_runaway_is_stopped() -> None:
    tasks_tools.forever.enqueue(0)
    with pytest.raises(RunawayTasks, match="5 attempts"):
        run_tasks(max_tasks=5)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: run_tasks(max_tasks=0), ValueError, "max_tasks must be a whole number"),
        (lambda: run_tasks(max_tasks=True), ValueError, "max_tasks must be a whole number"),
        (
            lambda: run_tasks(backend="immediate"),
            TypeError,
            "is an ImmediateBackend, not a SQLTask",
        ),
        (lambda: advance(-1), ValueError, "must not be negative"),
        (lambda: advance("1"), TypeError, "timedelta or a number of seconds"),
    ],
)
def test_bad_input(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()
