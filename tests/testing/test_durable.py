"""Durable tasks under run_tasks(): a sleep ends when the test moves the queue's clock past it,
and a wait when the test sends its event; in the test's own transaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from django_sqltasks import send_event
from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.testing import run_tasks
from tests import tasks_durable
from tests.tasks_durable import effects

pytestmark = pytest.mark.django_db


def test_run_tasks_runs_a_sleeping_task_on_once_the_clock_moves_past_its_sleep(
    tmp_path: Path,
) -> None:
    log = tmp_path / "log"
    result = tasks_durable.sleeper.enqueue(str(log), 3 * 86400)
    assert run_tasks() == []
    result.refresh()
    assert result.status == TaskResultStatus.READY
    [done] = run_tasks(fast_forward=True)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == "slept"
    assert effects(log) == ["before", "after"]


def test_run_tasks_runs_a_waiting_task_on_once_its_event_is_sent(tmp_path: Path) -> None:
    result = tasks_durable.waiter.enqueue(str(tmp_path / "log"), "order.paid", "77")
    assert run_tasks(fast_forward=True) == []  # it waits for its event, not for a clock
    send_event("order.paid", "77", {"ok": True})
    [done] = run_tasks()
    assert done.id == result.id and done.return_value == {"ok": True}
