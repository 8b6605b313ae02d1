"""The gauntlet, bad input: each bad enqueue, row or task fails alone with a clear error, and
the tasks around it run as if nothing happened."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_sqltasks.compat import InvalidTask, TaskResultStatus
from django_sqltasks.exceptions import InvalidTaskArguments, PayloadTooLarge
from django_sqltasks.models import TaskRecord
from django_sqltasks.worker import Worker
from tests import gauntlet_tasks, tasks
from tests.conftest import WorkerProcess, run_burst_or_fail
from tests.events import EventLog

RunWorker = Callable[..., Worker]
StartWorker = Callable[..., WorkerProcess]
TABLE = TaskRecord._meta.db_table
TEN_MB = 10 * 1024 * 1024
TASK_NOT_FOUND = "django_sqltasks.exceptions.TaskNotFound"


# Refused at enqueue --------------------------------------------------------------------------


BAD_ENQUEUES: list[tuple[str, Callable[[], Any], type[BaseException], str]] = [
    ("args not JSON", lambda: tasks.echo.enqueue(object()), InvalidTaskArguments, "args[0]"),
    (
        "kwargs not JSON",
        lambda: tasks.echo.enqueue(when=timezone.now()),
        InvalidTaskArguments,
        "kwargs['when'] is a datetime.datetime",
    ),
    ("NaN", lambda: tasks.echo.enqueue(float("nan")), InvalidTaskArguments, "nan"),
    ("huge int", lambda: tasks.echo.enqueue(2**70), InvalidTaskArguments, "64-bit"),
    ("non-str key", lambda: tasks.echo.enqueue({1: "a"}), InvalidTaskArguments, "key 1"),
    ("NUL character", lambda: tasks.echo.enqueue("a\x00b"), InvalidTaskArguments, "NUL"),
    ("lone surrogate", lambda: tasks.echo.enqueue(x="\ud800"), InvalidTaskArguments, "surrogate"),
    (
        "10 MB payload",
        lambda: gauntlet_tasks.size.enqueue("x" * TEN_MB),
        PayloadTooLarge,
        "MAX_PAYLOAD_BYTES",
    ),
    ("priority 101", lambda: tasks.noop.using(priority=101).enqueue(), InvalidTask, "priority"),
    ("priority -101", lambda: tasks.noop.using(priority=-101).enqueue(), InvalidTask, "priority"),
    ("unknown queue", lambda: tasks.noop.using(queue_name="nope").enqueue(), InvalidTask, "nope"),
    (
        "naive run_after",
        lambda: tasks.noop.using(run_after=datetime(2030, 1, 1)).enqueue(),
        InvalidTask,
        "aware datetime",
    ),
    (
        "not a task",
        lambda: tasks.add.get_backend().enqueue(print, [], {}),
        Exception,
        "",
    ),
]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [pytest.param(fn, error, message, id=name) for name, fn, error, message in BAD_ENQUEUES],
)
def test_bad_enqueue_is_refused_with_a_clear_error(
    bad: Callable[[], Any], error: type[BaseException], message: str
) -> None:
    with pytest.raises(error) as info:
        bad()
    assert message.lower() in str(info.value).lower()
    assert not TaskRecord.objects.exists(), "the refused task left a row behind"


@pytest.mark.django_db(transaction=True)
def test_bad_enqueues_leave_the_tasks_around_them_alone(run_worker: RunWorker) -> None:
    good = [tasks.add.enqueue(0, 0)]
    for _name, bad, error, _message in BAD_ENQUEUES:
        with pytest.raises(error):
            bad()
        good.append(tasks.add.enqueue(len(good), len(good)))
    assert TaskRecord.objects.count() == len(good)
    run_worker()
    assert [tasks.add.get_result(r.id).return_value for r in good] == [
        i * 2 for i in range(len(good))
    ]


@pytest.mark.django_db(transaction=True)
def test_a_10_mb_payload_runs_when_the_limit_is_lifted(
    run_worker: RunWorker, settings: Any
) -> None:
    default = settings.TASKS["default"]
    settings.TASKS = {
        **settings.TASKS,
        "default": {**default, "OPTIONS": {**default["OPTIONS"], "MAX_PAYLOAD_BYTES": None}},
    }
    big = gauntlet_tasks.size.enqueue("x" * TEN_MB)
    small = tasks.add.enqueue(1, 2)
    run_worker()
    assert gauntlet_tasks.size.get_result(big.id).return_value == TEN_MB
    assert tasks.add.get_result(small.id).return_value == 3


# Rows no enqueue would write -----------------------------------------------------------------


def insert_row(task_path: str = "tests.tasks.echo", **fields: Any) -> TaskRecord:
    return TaskRecord.objects.create(task_path=task_path, backend_name="default", **fields)


no_nul = pytest.mark.skipif(
    connection.vendor == "postgresql", reason="PostgreSQL text cannot hold NUL: no such row exists"
)
BAD_ROWS: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "a module attribute that is not a task",
        {"task_path": "tests.tasks.NOT_A_TASK"},
        TASK_NOT_FOUND,
        "not a Task",
    ),
    ("a missing module", {"task_path": "no_such_module.task"}, TASK_NOT_FOUND, "is not loaded"),
    ("a missing function", {"task_path": "tests.tasks.nope"}, TASK_NOT_FOUND, "does not import"),
    ("a builtin", {"task_path": "builtins.eval", "args": ["1"]}, TASK_NOT_FOUND, "not a Task"),
    ("an empty path", {"task_path": ""}, TASK_NOT_FOUND, "not a dotted path"),
    ("an empty part", {"task_path": "tests..tasks.add"}, TASK_NOT_FOUND, "not a dotted path"),
    ("a NUL", {"task_path": "tests.tasks.add\x00"}, TASK_NOT_FOUND, "not a dotted path"),
    ("a module never loaded", {"task_path": "this.s"}, TASK_NOT_FOUND, "'this' is not loaded"),
    (
        "another backend's task",
        {"task_path": "tests.tasks_hardening.on_immediate", "args": ["/nonexistent/x"]},
        "django_sqltasks.exceptions.TaskBackendMismatch",
        "is declared for backend 'immediate', which is not a django-sqltasks backend",
    ),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        pytest.param(f, e, m, id=name, marks=[no_nul] if "\x00" in f["task_path"] else [])
        for name, f, e, m in BAD_ROWS
    ],
)
def test_a_row_naming_no_task_fails_alone(
    run_worker: RunWorker, fields: dict[str, Any], error: str, message: str
) -> None:
    good = [tasks.add.enqueue(i, i) for i in range(5)]
    bad = insert_row(**fields)
    run_worker()
    bad.refresh_from_db()
    assert bad.status == TaskResultStatus.FAILED
    assert bad.errors[0]["exception_class_path"] == error
    assert message in bad.errors[0]["traceback"]
    assert all(tasks.add.get_result(r.id).status == TaskResultStatus.SUCCESSFUL for r in good)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param({"args": {"a": 1}}, "args", id="args is an object"),
        pytest.param({"kwargs": [1, 2]}, "kwargs", id="kwargs is a list"),
        pytest.param({"args": "text"}, "args", id="args is a string"),
    ],
)
def test_a_row_with_misshapen_arguments_fails_with_a_clear_error(
    run_worker: RunWorker, fields: dict[str, Any], message: str
) -> None:
    good = tasks.add.enqueue(1, 2)
    bad = insert_row("tests.tasks.echo", **fields)
    run_worker()
    bad.refresh_from_db()
    assert tasks.add.get_result(good.id).return_value == 3
    assert bad.status == TaskResultStatus.FAILED
    assert message in bad.errors[0]["traceback"].splitlines()[-1]


def write_corrupt_json(record: TaskRecord) -> None:
    """Store text that is not JSON in ``args``, past the column's JSON check."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA ignore_check_constraints = ON")
            cursor.execute(f"UPDATE {TABLE} SET args = %s WHERE id = %s", ["[1, 2", record.id.hex])
            cursor.execute("PRAGMA ignore_check_constraints = OFF")
        else:
            cursor.execute("SET SESSION check_constraint_checks = OFF")
            cursor.execute(f"UPDATE {TABLE} SET args = %s WHERE id = %s", ["[1, 2", record.id.hex])
            cursor.execute("SET SESSION check_constraint_checks = ON")


@pytest.mark.skipif(
    connection.vendor == "postgresql",
    reason="jsonb refuses text that is not JSON: no such row can exist",
)
@pytest.mark.django_db(transaction=True)
def test_a_row_with_corrupt_json_fails_alone(run_worker: RunWorker) -> None:
    if connection.vendor == "mysql" and not connection.mysql_is_mariadb:
        pytest.skip("MySQL's JSON type refuses text that is not JSON: no such row can exist")
    bad = insert_row("tests.tasks.echo", args=[1, 2])
    write_corrupt_json(bad)
    good = [tasks.add.enqueue(i, i) for i in range(5)]
    run_burst_or_fail(5, "the worker kept claiming the corrupt row (and its batch) again and again")
    bad.refresh_from_db()
    assert bad.status == TaskResultStatus.FAILED
    assert all(tasks.add.get_result(r.id).status == TaskResultStatus.SUCCESSFUL for r in good)


# Tasks that misbehave ------------------------------------------------------------------------


MISBEHAVING: list[tuple[Any, str]] = [
    (tasks.raise_system_exit, "builtins.SystemExit"),
    (tasks.raise_keyboard_interrupt, "builtins.KeyboardInterrupt"),
    (gauntlet_tasks.raise_memory_error, "builtins.MemoryError"),
    (gauntlet_tasks.async_raise_system_exit, "builtins.SystemExit"),
    (gauntlet_tasks.async_raise_keyboard_interrupt, "builtins.KeyboardInterrupt"),
    (tasks.return_not_json, "django_sqltasks.exceptions.InvalidReturnValue"),
]


@pytest.mark.django_db(transaction=True)
def test_misbehaving_tasks_fail_alone_and_the_worker_carries_on(run_worker: RunWorker) -> None:
    bad = [(task.enqueue(), error) for task, error in MISBEHAVING]
    good = [tasks.add.enqueue(i, i) for i in range(20)]
    worker = run_worker(concurrency=2)
    for result, error in bad:
        record = TaskRecord.objects.get(id=result.id)
        assert record.status == TaskResultStatus.FAILED, record.task_path
        assert [e["exception_class_path"] for e in record.errors] == [error]
    assert [tasks.add.get_result(r.id).return_value for r in good] == [i * 2 for i in range(20)]
    assert worker.processed == len(bad) + len(good)


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker_process
@pytest.mark.parametrize("task", [gauntlet_tasks.never_returns, gauntlet_tasks.async_never_returns])
def test_a_task_that_never_returns_holds_one_slot_until_the_shutdown_timeout(
    worker_process: StartWorker, events: EventLog, tmp_path: Path, task: Any
) -> None:
    log = tmp_path / "executions"
    hung = task.enqueue(str(log))
    lease, interval = 1.0, 0.25
    env = {"SQLTASKS_LEASE_TIMEOUT": str(lease), "SQLTASKS_HEARTBEAT_INTERVAL": str(interval)}
    worker = worker_process("--concurrency", "2", "--shutdown-timeout", "1", env=env)
    started = events.wait("note", what="start")[0]
    others = [tasks.add.enqueue(i, i) for i in range(30)]
    for result in others:
        events.wait("task_finished", id=str(result.id), timeout=30)
    # Past the lease: the heartbeat keeps a live worker's task its own.
    events.wait("rescue_pass", lambda e: e.at > started.at + lease + interval)
    record = TaskRecord.objects.get(id=hung.id)
    assert record.status == TaskResultStatus.RUNNING
    assert record.errors == []
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output
    record.refresh_from_db()
    assert record.status == TaskResultStatus.READY
    assert record.errors[-1]["exception_class_path"] == "django_sqltasks.exceptions.WorkerStopped"
    assert record.owner is None
    assert time.monotonic() > 0 and timedelta(0) <= timezone.now() - record.available_at


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("kind", "message"), [("nul", "NUL"), ("surrogate", "surrogate")])
def test_a_return_value_the_database_cannot_store_fails_alone(kind: str, message: str) -> None:
    """PostgreSQL's jsonb refuses a NUL character: one such result must fail its own task,
    not block the batch of outcomes written with it."""
    bad = gauntlet_tasks.return_unstorable.enqueue(kind)
    good = [tasks.add.enqueue(i, i) for i in range(10)]
    run_burst_or_fail(10, "the worker could not write its outcomes")
    record = TaskRecord.objects.get(id=bad.id)
    assert record.status == TaskResultStatus.FAILED
    assert record.errors[0]["exception_class_path"] == (
        "django_sqltasks.exceptions.InvalidReturnValue"
    )
    assert message in record.errors[0]["traceback"]
    assert all(tasks.add.get_result(r.id).status == TaskResultStatus.SUCCESSFUL for r in good)


@pytest.mark.django_db(transaction=True)
def test_a_20_mb_return_value_does_not_block_other_outcomes() -> None:
    size = 20 * 1024 * 1024
    bad = gauntlet_tasks.big_result.enqueue(size)
    good = [tasks.add.enqueue(i, i) for i in range(10)]
    run_burst_or_fail(20, "the worker could not write its outcomes")
    record = TaskRecord.objects.get(id=bad.id)
    assert record.status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
    assert all(tasks.add.get_result(r.id).status == TaskResultStatus.SUCCESSFUL for r in good)
