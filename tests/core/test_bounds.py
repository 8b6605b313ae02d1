"""Numbers a worker computes with are finite and bounded where they are set: OPTIONS, task
options, command-line flags. A number past a bound (inf, NaN, 1e300) used to pass, then
overflow a ``timedelta`` in a worker and leave its task RUNNING."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_sqltasks.compat import InvalidTask, TaskResultStatus, task_backends
from django_sqltasks.core.bounds import MAX_COUNT, MAX_DELAY
from django_sqltasks.core.options import BackendOptions, OptionError
from django_sqltasks.core.policy import Policy
from django_sqltasks.models import TaskRecord
from django_sqltasks.worker import Worker
from tests import forkserver, tasks
from tests.conftest import ROOT, set_backend_options, worker_env

RunWorker = Callable[..., Worker]
BAD_NUMBERS = [float("inf"), float("-inf"), float("nan"), 1e300, -1]
SECONDS_OPTIONS = [
    "LEASE_TIMEOUT",
    "HEARTBEAT_INTERVAL",
    "POLL_INTERVAL",
    "RETRY_BACKOFF",
    "RETRY_BACKOFF_MAX",
    "TIMEOUT",
    "PRUNE_SUCCESSFUL_DAYS",
    "PRUNE_FAILED_DAYS",
    "PRUNE_UNCLAIMED_EVENT_DAYS",
]
FAIL_ERROR = "builtins.ValueError"  # what tests.tasks.fail raises
COUNT_OPTIONS = ["MAX_ATTEMPTS", "MAX_RESCUES", "MAX_SNOOZES", "MAX_PAYLOAD_BYTES"]


@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
@pytest.mark.parametrize("name", SECONDS_OPTIONS + COUNT_OPTIONS)
def test_a_numeric_option_out_of_bounds_is_refused_by_name(name: str, value: float) -> None:
    with pytest.raises(OptionError) as caught:
        BackendOptions.parse("custom", {name: value})
    message = str(caught.value)
    assert f"TASKS['custom']['OPTIONS']['{name}'] must be" in message
    assert repr(value) in message


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LEASE_TIMEOUT", 86401),
        ("POLL_INTERVAL", 86401),
        ("RETRY_BACKOFF_MAX", MAX_DELAY + 1),
        ("TIMEOUT", MAX_DELAY + 1),
        ("PRUNE_FAILED_DAYS", 36501),
        ("MAX_ATTEMPTS", MAX_COUNT + 1),
        ("MAX_RESCUES", 10**400),
        ("MAX_SNOOZES", MAX_COUNT + 1),
    ],
)
def test_the_bound_of_each_option_is_in_its_error(name: str, value: float) -> None:
    with pytest.raises(OptionError, match=rf"\['{name}'\] must be .*at most"):
        BackendOptions.parse("custom", {name: value})


def test_the_largest_values_of_the_bounds_are_accepted() -> None:
    options = BackendOptions.parse(
        "custom",
        {
            "LEASE_TIMEOUT": 86400,
            "HEARTBEAT_INTERVAL": 43200,
            "POLL_INTERVAL": 86400,
            "RETRY_BACKOFF": MAX_DELAY,
            "RETRY_BACKOFF_MAX": MAX_DELAY,
            "TIMEOUT": MAX_DELAY,
            "PRUNE_SUCCESSFUL_DAYS": 36500,
            "MAX_ATTEMPTS": MAX_COUNT,
            "MAX_RESCUES": MAX_COUNT,
            "MAX_SNOOZES": MAX_COUNT,
        },
    )
    assert options.max_attempts == MAX_COUNT


@pytest.mark.parametrize("value", [*BAD_NUMBERS, 2.5, MAX_COUNT + 1], ids=repr)
def test_a_queue_limit_out_of_bounds_is_refused_by_name(value: float) -> None:
    with pytest.raises(OptionError, match=r"\['QUEUE_LIMITS'\]\['q'\]\['concurrency'\] must be"):
        BackendOptions.parse("custom", {"QUEUE_LIMITS": {"q": {"concurrency": value}}})


@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
@pytest.mark.parametrize("name", ["retry_backoff", "timeout", "max_attempts", "concurrency_limit"])
def test_a_numeric_task_option_out_of_bounds_is_refused_by_name(name: str, value: float) -> None:
    task_class = task_backends["default"].task_class
    with pytest.raises(InvalidTask, match=rf"^{name} must be .*at most"):
        task_class(func=tasks.noop.func, **{name: value})


@pytest.mark.parametrize("value", ["inf", "nan", "1e300", "-1"])
@pytest.mark.parametrize(
    ("command", "flag"),
    [
        ("tasks_worker", "--poll-interval"),
        ("tasks_worker", "--shutdown-timeout"),
        ("tasks_worker", "--wait-for-database"),
        ("tasks_prune", "--days"),
        ("tasks_prune", "--failed-days"),
        ("tasks_prune", "--unclaimed-event-days"),
    ],
)
def test_a_numeric_flag_out_of_bounds_is_refused_by_name(
    command: str, flag: str, value: str
) -> None:
    with pytest.raises(CommandError, match=f"{flag}: must be"):
        call_command(command, flag, value)


@pytest.mark.parametrize(
    ("option", "value"),
    [("poll_interval", float("inf")), ("poll_interval", 0), ("shutdown_timeout", float("nan"))],
)
def test_the_worker_class_refuses_numbers_out_of_bounds(option: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"{option} must be a positive number of seconds"):
        Worker(**{option: value})


@pytest.mark.parametrize(("name", "value"), [("LEASE_TIMEOUT", "nan"), ("POLL_INTERVAL", "inf")])
def test_a_worker_with_an_option_out_of_bounds_stops_with_the_rule_not_a_traceback(
    name: str, value: str
) -> None:
    done = forkserver.run_django(
        ["tasks_worker", "--burst"],
        worker_env(**{f"SQLTASKS_{name}": value}),
        worker_env(),
        str(ROOT),
        timeout=60,
    )
    assert done.returncode != 0
    assert f"['{name}'] must be a positive number of seconds" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("backoff", "backoff_max", "attempt"),
    [
        (1e300, 1e300, 5),
        (float("inf"), float("inf"), 3),
        (float("nan"), float("nan"), 2),
        (1.0, 300.0, 10**6),
        (-5.0, 300.0, 2),
    ],
)
def test_a_policy_built_past_validation_still_gives_a_delay_in_bounds(
    backoff: float, backoff_max: float, attempt: int
) -> None:
    policy = Policy(
        max_attempts=MAX_COUNT,
        retry_on=(Exception,),
        backoff=backoff,
        backoff_max=backoff_max,
        timeout=None,
    )
    assert all(0 <= policy.delay(attempt) <= MAX_DELAY for _ in range(20))


@pytest.mark.django_db(transaction=True)
def test_a_retry_after_many_attempts_is_written_not_left_running(
    run_worker: RunWorker, settings: Any
) -> None:
    """MAX_ATTEMPTS at its bound, and a task on its 1,500th attempt: 2 ** 1,499 seconds of
    backoff did not fit a float, the worker's retry raised, and the task stayed RUNNING."""
    set_backend_options(settings, MAX_ATTEMPTS=MAX_COUNT)  # RETRY_BACKOFF 1.0 s, capped at 300
    result = tasks.fail.enqueue()
    TaskRecord.objects.filter(id=result.id).update(attempts=1499)  # time is data
    run_worker()
    row = TaskRecord.objects.get(id=result.id)
    assert row.status == TaskResultStatus.READY
    assert row.attempts == 1500
    assert [e["exception_class_path"] for e in row.errors] == [FAIL_ERROR]
    assert timezone.now() < row.available_at <= timezone.now() + timedelta(seconds=301)


@pytest.mark.django_db(transaction=True)
def test_a_backoff_that_overflows_still_writes_an_outcome(run_worker: RunWorker) -> None:
    """Options built past validation (1e300 s of backoff, no cap): the delay is capped at
    MAX_DELAY, the retry is written, and nothing stays RUNNING."""
    backend = task_backends["default"]
    original = backend.config
    backend.config = replace(
        original, max_attempts=3, retry_backoff=1e300, retry_backoff_max=float("inf")
    )
    try:
        result = tasks.fail.enqueue()  # no retry options of its own: the backend's apply
        run_worker()
    finally:
        backend.config = original
    row = TaskRecord.objects.get(id=result.id)
    assert row.status == TaskResultStatus.READY
    assert [e["exception_class_path"] for e in row.errors] == [FAIL_ERROR]
    assert row.available_at > timezone.now() + timedelta(days=100)
