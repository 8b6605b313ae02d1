"""Snooze: a task puts itself back to READY for a while, with no error and no attempt spent,
bounded by MAX_SNOOZES; on every database, through a real worker."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from django_sqltasks import Snooze
from django_sqltasks.backend import SQLTaskBackend
from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.exceptions import SnoozeLimitReached
from django_sqltasks.models import TaskRecord
from django_sqltasks.worker import Worker
from tests import tasks_flow
from tests.conftest import set_backend_options, wait_for, worker_thread

pytestmark = pytest.mark.django_db(transaction=True)

RunWorker = Callable[..., Worker]


@pytest.mark.parametrize("task", [tasks_flow.snooze_an_hour, tasks_flow.async_snooze_an_hour])
def test_a_snooze_puts_the_task_back_without_an_error_or_an_attempt(
    task: Any, run_worker: RunWorker
) -> None:
    result = task.enqueue()
    before = timezone.now()
    run_worker()
    row = TaskRecord.objects.get(pk=result.id)
    assert row.status == TaskResultStatus.READY
    assert row.errors == []
    assert row.attempts == 0  # the snoozed run does not count against max_attempts
    assert row.snoozes == 1
    assert len(row.worker_ids) == 1  # the run is still on record
    assert row.finished_at is None
    assert before + timedelta(minutes=59) < row.available_at < before + timedelta(minutes=61)


def test_a_snoozed_task_runs_again_after_its_delay(tmp_path: Path) -> None:
    counter = tmp_path / "calls"
    result = tasks_flow.snooze_once.enqueue(str(counter), 1.0)
    started = time.monotonic()
    with worker_thread(Worker(queue_names=["*"], concurrency=2)):
        wait_for(lambda: TaskRecord.objects.get(pk=result.id).status == "SUCCESSFUL", timeout=20)
    assert time.monotonic() - started >= 1.0
    row = TaskRecord.objects.get(pk=result.id)
    assert row.return_value == 2  # the second call
    assert (row.attempts, row.snoozes, row.errors) == (1, 1, [])
    assert len(row.worker_ids) == 2


def test_a_task_fails_past_max_snoozes(settings: Any, run_worker: RunWorker) -> None:
    set_backend_options(settings, MAX_SNOOZES=2, MAX_ATTEMPTS=3)
    result = tasks_flow.snooze_now.enqueue()
    run_worker()  # the snoozes are due at once: the burst worker runs them all
    row = TaskRecord.objects.get(pk=result.id)
    assert row.status == TaskResultStatus.FAILED
    assert row.snoozes == 2
    assert len(row.worker_ids) == 3
    (error,) = row.errors  # not retried: MAX_ATTEMPTS does not apply to it
    assert error["exception_class_path"] == "django_sqltasks.exceptions.SnoozeLimitReached"
    assert "MAX_SNOOZES is 2" in error["traceback"]


def test_max_snoozes_zero_fails_the_first_snooze(settings: Any, run_worker: RunWorker) -> None:
    set_backend_options(settings, MAX_SNOOZES=0)
    result = tasks_flow.snooze_now.enqueue()
    run_worker()
    row = TaskRecord.objects.get(pk=result.id)
    assert (row.status, row.snoozes, len(row.errors)) == ("FAILED", 0, 1)


@pytest.mark.parametrize(
    ("seconds", "kind", "message"),
    [
        (-1, ValueError, "zero or more"),
        (math.nan, ValueError, "finite"),
        (math.inf, ValueError, "finite"),
        (366 * 86400 + 1, ValueError, "at most 31622400"),
        (True, TypeError, "a number of seconds"),
        ("5", TypeError, "a number of seconds"),
        (None, TypeError, "a number of seconds"),
    ],
)
@pytest.mark.django_db(transaction=False)
def test_snooze_checks_its_argument(seconds: Any, kind: type, message: str) -> None:
    with pytest.raises(kind, match=message):
        Snooze(seconds)


@pytest.mark.django_db(transaction=False)
def test_snooze_keeps_its_delay() -> None:
    assert Snooze(0).seconds == 0.0
    assert Snooze(2.5).seconds == 2.5
    assert "2.5" in str(Snooze(2.5))
    assert issubclass(SnoozeLimitReached, Exception)


@pytest.mark.parametrize("value", [-1, 2.5, True, "100"])
@pytest.mark.django_db(transaction=False)
def test_the_system_check_refuses_a_bad_max_snoozes(value: Any) -> None:
    backend = SQLTaskBackend(
        "custom",
        {"BACKEND": "django_sqltasks.backend.SQLTaskBackend", "OPTIONS": {"MAX_SNOOZES": value}},
    )
    (found,) = backend.check()
    assert found.id == "django_sqltasks.E002"
    assert "['MAX_SNOOZES'] must be a whole number (0 or more)" in found.msg


def test_the_task_page_shows_the_snoozes(run_worker: RunWorker) -> None:
    from django.urls import reverse

    from tests.factories import superuser_client

    result = tasks_flow.snooze_an_hour.enqueue()
    run_worker()
    url = reverse("admin:django_sqltasks_taskrecord_change", args=[result.id])
    page = superuser_client().get(url).content.decode()
    assert "Snoozes" in page and "raised Snooze" in page
