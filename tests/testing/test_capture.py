"""capture_tasks() and the sqltasks fixture: what a test enqueued, and assertions on it."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_sqltasks.compat import task_backends
from django_sqltasks.testing import CapturedTasks, capture_tasks
from django_sqltasks.testing.pytest_plugin import TasksFixture
from tests import tasks

pytestmark = pytest.mark.django_db(transaction=False)


def test_captures_each_enqueue_with_its_arguments() -> None:
    with capture_tasks() as captured:
        first = tasks.add.enqueue(1, 2)
        tasks.echo.using(queue_name="other", priority=5).enqueue("x", key=(1, 2))
    assert [r.id for r in captured] == [first.id, captured[1].id]
    assert captured.assert_enqueued(tasks.add, args=[1, 2]).id == first.id
    # Tuples compare as the lists they are stored as.
    captured.assert_enqueued(tasks.echo, args=("x",), kwargs={"key": [1, 2]}, queue="other")
    captured.assert_enqueued(tasks.echo, priority=5, backend="default", count=1)


def test_a_mismatch_fails_listing_what_was_enqueued() -> None:
    with capture_tasks() as captured:
        tasks.add.enqueue(1, 2)
    with pytest.raises(AssertionError) as failure:
        captured.assert_enqueued(tasks.add, args=[2, 1])
    message = str(failure.value)
    assert "tests.tasks.add(args=[2, 1])" in message
    assert "tests.tasks.add(args=[1, 2], kwargs={})" in message
    with pytest.raises(AssertionError, match="enqueued 1 time"):
        captured.assert_enqueued(tasks.add, count=2)
    with pytest.raises(AssertionError, match="Nothing was enqueued"):
        CapturedTasks().assert_enqueued(tasks.add)


def test_assert_not_enqueued() -> None:
    with capture_tasks() as captured:
        tasks.add.enqueue(1, 2)
    captured.assert_not_enqueued(tasks.noop)
    captured.assert_not_enqueued(tasks.add, kwargs={"a": 1})
    captured.assert_not_enqueued(tasks.add, queue="other")
    with pytest.raises(AssertionError, match="not to be enqueued"):
        captured.assert_not_enqueued(tasks.add)


def test_only_inside_the_block() -> None:
    tasks.add.enqueue(0, 0)
    with capture_tasks() as captured:
        pass
    tasks.add.enqueue(1, 1)
    assert captured == []


def test_enqueue_many_is_captured_and_a_deduplicated_enqueue_is_not() -> None:
    with capture_tasks() as captured:
        task_backends["default"].enqueue_many(tasks.add, [((1, 2), {}), ((3, 4), {})])
        tasks.refresh_report.enqueue(7)
        tasks.refresh_report.enqueue(7)  # returns the live task: nothing new
    assert len(captured.of(tasks.add)) == 2
    captured.assert_enqueued(tasks.refresh_report, args=[7], count=1)


def test_a_rolled_back_enqueue_was_still_sent() -> None:
    # The row is gone, but the call happened: what the test asserts on is the call.
    with capture_tasks() as captured:
        try:
            with transaction.atomic():
                tasks.add.enqueue(1, 2)
                raise ZeroDivisionError
        except ZeroDivisionError:
            pass
    captured.assert_enqueued(tasks.add)


def test_a_non_task_is_refused() -> None:
    with pytest.raises(TypeError, match="must be a Task"):
        CapturedTasks().assert_enqueued(tasks.add.func)


def test_the_pytest_fixture_captures_and_runs(sqltasks: TasksFixture) -> None:
    assert isinstance(sqltasks, TasksFixture)
    result = tasks.add.enqueue(2, 3)
    sqltasks.assert_enqueued(tasks.add, args=[2, 3])
    [finished] = sqltasks.run()
    assert finished.id == result.id
    assert finished.return_value == 5
