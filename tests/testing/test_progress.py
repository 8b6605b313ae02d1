"""run_tasks() with what a worker also does: a task that snoozes goes back in the queue on the
test's clock, and what a task reports through its context is stored."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus, task_backends
from django_sqltasks.models import TaskRecord
from django_sqltasks.testing import advance, run_tasks
from tests import tasks_flow, tasks_progress
from tests.conftest import set_backend_options

pytestmark = pytest.mark.django_db(transaction=False)


def test_a_snoozed_task_waits_for_the_test_s_clock(tmp_path: Path) -> None:
    counter = tmp_path / "calls"
    result = tasks_flow.snooze_once.enqueue(str(counter), 60)
    before = timezone.now()
    assert run_tasks() == []  # snoozed: not finished
    row = TaskRecord.objects.get(pk=result.id)
    assert (row.status, row.attempts, row.snoozes, row.errors) == ("READY", 0, 1, [])
    assert before + timedelta(seconds=59) < row.available_at < before + timedelta(seconds=61)
    assert run_tasks() == []  # not due yet
    advance(timedelta(seconds=60))
    [done] = run_tasks()
    assert (done.status, done.return_value, done.attempts) == ("SUCCESSFUL", 2, 2)


def test_fast_forward_runs_a_snoozed_task_again(tmp_path: Path) -> None:
    result = tasks_flow.snooze_once.enqueue(str(tmp_path / "calls"), 3600)
    [done] = run_tasks(fast_forward=True)
    assert done.id == result.id and done.return_value == 2
    assert TaskRecord.objects.get(pk=result.id).snoozes == 1


def test_snoozing_past_max_snoozes_fails(settings: Any) -> None:
    set_backend_options(settings, MAX_SNOOZES=2, MAX_ATTEMPTS=3)
    result = tasks_flow.snooze_now.enqueue()
    [failed] = run_tasks()  # Snooze(0) is due at once: run again in the same call
    assert failed.id == result.id
    assert failed.status == TaskResultStatus.FAILED
    [error] = failed.errors  # not retried
    assert error.exception_class_path == "django_sqltasks.exceptions.SnoozeLimitReached"
    assert "MAX_SNOOZES is 2" in error.traceback
    assert TaskRecord.objects.get(pk=result.id).snoozes == 2


def test_an_async_task_snoozes_too() -> None:
    result = tasks_flow.async_snooze_an_hour.enqueue()
    assert run_tasks() == []
    assert TaskRecord.objects.get(pk=result.id).snoozes == 1


def test_run_tasks_stores_what_a_task_reports() -> None:
    result = tasks_progress.report_steps.enqueue(4)
    [done] = run_tasks()
    assert (done.progress, done.progress_note) == (1.0, "step 4 of 4")
    assert dict(done.metadata) == {"steps": 4, "done": True}
    again = task_backends["default"].get_result(result.id)
    assert again.progress == 1.0


def test_a_failed_attempt_keeps_its_report(settings: Any) -> None:
    set_backend_options(settings, MAX_ATTEMPTS=2, RETRY_BACKOFF=0)
    tasks_progress.report_and_fail.enqueue()
    [failed] = run_tasks()
    assert failed.status == TaskResultStatus.FAILED
    assert (failed.progress, failed.progress_note) == (0.3, "attempt 2")


def test_the_subject_is_on_the_result() -> None:
    from django.contrib.auth.models import User

    from django_sqltasks.core.subject import Subject
    from django_sqltasks.task import with_subject
    from tests import tasks

    user = User.objects.create(username="ada")
    enqueued = with_subject(tasks.add, user).enqueue(1, 2)
    expected = Subject(type="auth.user", id=str(user.pk))
    assert enqueued.subject == expected
    assert task_backends["default"].get_result(enqueued.id).subject == expected
    [done] = run_tasks()
    assert done.subject == expected
    plain = tasks.add.enqueue(1, 2)
    assert plain.subject is None
    assert task_backends["default"].get_result(plain.id).subject is None
