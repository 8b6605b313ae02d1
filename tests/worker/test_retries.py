"""Retries with backoff, per-attempt errors, and timeouts, run by a real worker."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from django_sqltasks.compat import InvalidTask, TaskResultStatus, task_backends
from django_sqltasks.core.policy import Policy
from django_sqltasks.task import SQLTask
from django_sqltasks.worker import Worker
from tests import tasks
from tests.conftest import set_backend_options

pytestmark = pytest.mark.django_db

RunWorker = Callable[..., Worker]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("flaky", [tasks.flaky, tasks.flaky_async], ids=["sync", "async"])
def test_a_retried_task_keeps_its_id_and_every_error(
    run_worker: RunWorker, tmp_path: Path, flaky: Any
) -> None:
    calls = tmp_path / "calls"
    result = flaky.enqueue(str(calls), 2)
    run_worker(concurrency=2)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3
    assert result.attempts == 3
    assert len(calls.read_text().splitlines()) == 3  # one call per attempt, each retry once
    assert len(result.worker_ids) == 3
    assert [e.exception_class_path for e in result.errors] == ["builtins.ConnectionError"] * 2
    assert "call 1 fails" in result.errors[0].traceback
    assert "call 2 fails" in result.errors[1].traceback


@pytest.mark.django_db(transaction=True)
def test_the_last_allowed_failure_is_final(run_worker: RunWorker, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    result = tasks.flaky.enqueue(str(calls), 10)
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 3
    assert len(result.errors) == 3
    assert len(calls.read_text().splitlines()) == 3
    assert result.finished_at is not None


@pytest.mark.django_db(transaction=True)
def test_only_listed_exceptions_are_retried(run_worker: RunWorker, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    result = tasks.fails_without_retry.enqueue(str(calls))
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1
    assert len(calls.read_text().splitlines()) == 1


@pytest.mark.django_db(transaction=True)
def test_retries_wait_for_the_backoff(run_worker: RunWorker, tmp_path: Path) -> None:
    result = tasks.flaky_with_backoff.enqueue(str(tmp_path / "calls"), 2)
    started = time.monotonic()
    # Not burst: a retry waiting for its backoff is not runnable yet, and burst would exit.
    run_worker(burst=False, max_tasks=3, poll_interval=0.02)
    elapsed = time.monotonic() - started
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    # Waits of at least half of 0.4 s, then half of 0.8 s (the rest is jitter).
    assert elapsed >= 0.6, elapsed


@pytest.mark.django_db(transaction=True)
def test_backend_default_applies_to_plain_tasks(settings: Any, run_worker: RunWorker) -> None:
    set_backend_options(settings, MAX_ATTEMPTS=2, RETRY_BACKOFF=0)
    result = tasks.fail.enqueue("twice")
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 2


@pytest.mark.django_db(transaction=True)
def test_exit_exceptions_are_not_retried(settings: Any, run_worker: RunWorker) -> None:
    set_backend_options(settings, MAX_ATTEMPTS=3)
    result = tasks.raise_system_exit.enqueue()
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("task", [tasks.slow_sync, tasks.slow_async])
def test_an_attempt_past_its_timeout_fails(run_worker: RunWorker, task: Any) -> None:
    result = task.enqueue(1.5)
    other = tasks.add.enqueue(1, 2)
    started = time.monotonic()
    worker = run_worker(concurrency=2)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "django_sqltasks.exceptions.TaskTimeout"
    assert "longer than its timeout of 0.3s" in result.errors[0].traceback
    assert tasks.add.get_result(other.id).return_value == 3
    assert worker.processed == 2
    # Async tasks are cancelled; a sync task's thread runs on until its sleep ends.
    assert time.monotonic() - started < 3


def test_policy_backoff_is_exponential_capped_and_jittered() -> None:
    policy = Policy(max_attempts=10, retry_on=(Exception,), backoff=1, backoff_max=5, timeout=None)
    for attempt, full in [(1, 1), (2, 2), (3, 4), (4, 5), (9, 5)]:
        delays = [policy.delay(attempt) for _ in range(50)]
        assert all(full / 2 <= d <= full for d in delays), (attempt, delays)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be a whole number of at least 1"),
        ({"retry_on": ValueError}, "retry_on must be a tuple of exception classes"),
        ({"retry_backoff": -1}, "retry_backoff must be a non-negative number"),
        ({"timeout": 0}, "timeout must be a positive number"),
        ({"dedupe": "yes"}, "dedupe must be True, False, 'subject' or a callable"),
    ],
)
def test_bad_task_options_are_refused_by_name(options: dict[str, Any], message: str) -> None:
    task_class = task_backends["default"].task_class
    assert task_class is SQLTask
    with pytest.raises(InvalidTask, match=message):
        task_class(func=tasks.noop.func, **options)
