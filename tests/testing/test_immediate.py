"""ImmediateSQLTaskBackend: tasks run as they are enqueued, with every @task option."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.testing import capture_tasks
from tests import tasks, tasks_tools

pytestmark = pytest.mark.django_db(transaction=False)


@pytest.fixture(autouse=True)
def immediate(settings: Any) -> None:
    default = settings.TASKS["default"]
    settings.TASKS = {
        **settings.TASKS,
        "default": {**default, "BACKEND": "django_sqltasks.testing.ImmediateSQLTaskBackend"},
    }


def test_enqueue_returns_the_finished_result() -> None:
    result = tasks.add.enqueue(1, 2)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3
    assert tasks.add.get_result(result.id).return_value == 3


def test_task_options_are_kept(tmp_path: Path) -> None:
    # Django's ImmediateBackend refuses @task(max_attempts=...); this one retries.
    result = tasks.flaky.enqueue(str(tmp_path / "calls"), 2)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 3
    failed = tasks_tools.fails_with_backoff.enqueue()  # backoff of 60 s, fast-forwarded
    assert failed.status == TaskResultStatus.FAILED
    assert failed.attempts == 3
    assert tasks.slow_sync.enqueue(0.5).status == TaskResultStatus.FAILED


def test_a_child_runs_after_its_parent_not_inside_it() -> None:
    with capture_tasks() as captured:
        result = tasks_tools.parent.enqueue([1])
    assert result.status == TaskResultStatus.SUCCESSFUL
    child = captured.assert_enqueued(tasks_tools.add_one, args=[1])
    assert child.status == TaskResultStatus.READY  # as the enqueue returned it, mid-parent
    assert tasks_tools.add_one.get_result(child.id).return_value == 2


def test_enqueue_many_and_aenqueue_run_too() -> None:
    from django_sqltasks.compat import task_backends

    results = task_backends["default"].enqueue_many(tasks.add, [((1, 1), {}), ((2, 2), {})])
    assert [r.return_value for r in results] == [2, 4]


@pytest.mark.django_db(transaction=True)  # aenqueue writes through another thread
async def test_aenqueue() -> None:
    result = await tasks.add.aenqueue(5, 5)
    assert result.return_value == 10
