"""Outcomes and rows that once wedged the worker: each now fails alone, on every database, and
the tasks around it run."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.core.storable import MAX_TRACEBACK_CHARS
from django_sqltasks.models import TaskRecord
from tests import tasks, tasks_wedges
from tests.conftest import WorkerProcess, run_burst_or_fail, set_backend_options

OUTCOME_NOT_STORED = "django_sqltasks.exceptions.OutcomeNotStored"
CORRUPT_TASK = "django_sqltasks.exceptions.CorruptTask"
TABLE = TaskRecord._meta.db_table


def _others(count: int = 20) -> list[str]:
    return [str(tasks.add.enqueue(i, i).id) for i in range(count)]


def _assert_all_succeeded(ids: list[str]) -> None:
    statuses = set(TaskRecord.objects.filter(id__in=ids).values_list("status", flat=True))
    assert statuses == {TaskResultStatus.SUCCESSFUL}
    assert all(
        len(errors) == 0
        for errors in TaskRecord.objects.filter(id__in=ids).values_list("errors", flat=True)
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("task", "escaped"),
    [(tasks_wedges.raise_surrogate, "report\\udce9.txt"), (tasks_wedges.raise_nul, "\\x00")],
)
def test_an_exception_message_no_database_can_store_fails_alone(task: object, escaped: str) -> None:
    """A lone surrogate (a file name that is not UTF-8) or a NUL byte in a message: the
    traceback is stored escaped, and the 20 tasks enqueued after it run."""
    bad = task.enqueue()
    others = _others()
    run_burst_or_fail(30, "the worker wedged on an outcome it could not store")
    record = TaskRecord.objects.get(id=bad.id)
    assert record.status == TaskResultStatus.FAILED
    assert record.errors[-1]["exception_class_path"] == "builtins.ValueError"
    assert escaped in record.errors[-1]["traceback"]
    _assert_all_succeeded(others)


@pytest.mark.django_db(transaction=True)
def test_a_huge_exception_message_is_stored_capped() -> None:
    """A 20 MB message: the traceback is cut to MAX_TRACEBACK_CHARS, saying so, and keeps its
    end (the exception line)."""
    bad = tasks_wedges.raise_huge.enqueue(20 * 2**20)
    others = _others()
    run_burst_or_fail(60, "the worker wedged on a 20 MB traceback")
    record = TaskRecord.objects.get(id=bad.id)
    assert record.status == TaskResultStatus.FAILED
    stored = record.errors[-1]["traceback"]
    assert len(stored) <= MAX_TRACEBACK_CHARS
    assert f"a stored traceback keeps at most {MAX_TRACEBACK_CHARS:,} characters" in stored
    assert stored.startswith("Traceback (most recent call last):")
    assert stored.rstrip().endswith("EEEE")
    _assert_all_succeeded(others)


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "mysql", reason="max_allowed_packet is MySQL's")
def test_a_return_value_over_max_allowed_packet_fails_alone_and_the_worker_stops(
    settings: object,
) -> None:
    """With MAX_PAYLOAD_BYTES lifted, a return value over max_allowed_packet is salvaged as
    OutcomeNotStored, naming the limit, before it is sent; the worker then stops at once."""
    set_backend_options(settings, MAX_PAYLOAD_BYTES=None)
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        packet = int(cursor.fetchone()[0])
    bad = tasks_wedges.return_huge.enqueue(packet + 1024)
    others = _others()
    started = time.monotonic()
    run_burst_or_fail(60, "the worker wedged on an outcome over max_allowed_packet")
    assert time.monotonic() - started < 30
    record = TaskRecord.objects.get(id=bad.id)
    assert record.status == TaskResultStatus.FAILED
    assert record.errors[-1]["exception_class_path"] == OUTCOME_NOT_STORED
    assert "max_allowed_packet" in record.errors[-1]["traceback"]
    assert record.owner is None and record.return_value is None
    _assert_all_succeeded(others)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("task_path", ["tests.tasks.add", "tests.tasks.async_add"])
def test_a_row_nested_deeper_than_the_decoder_allows_fails_alone(task_path: str) -> None:
    """A row written in the database directly (stale or tampered) whose args are 1,030 nested
    lists: it fails as CorruptTask, and frees its slot (an async task's too); the tasks claimed
    with it run, with no error added."""
    others = _others(10)
    bad_id = uuid.uuid4()
    now = timezone.now()
    TaskRecord.objects.create(
        id=bad_id,
        task_path=task_path,
        backend_name="default",
        args=[],
        kwargs={},
        enqueued_at=now,
        available_at=now,
    )
    try:
        with connection.cursor() as cursor:
            cast = "::jsonb" if connection.vendor == "postgresql" else ""
            cursor.execute(
                f"UPDATE {TABLE} SET args = %s{cast} WHERE id = %s",
                [_nested(1030), bad_id.hex if connection.vendor != "postgresql" else bad_id],
            )
    except Exception as e:  # a database that refuses to store it cannot be wedged by it
        pytest.skip(f"{connection.vendor} refuses JSON nested 1,030 deep: {e}")
    run_burst_or_fail(30, "one deep row blocked every claim")
    # Read without the args column: Django's JSONField would decode it with the json module.
    record = TaskRecord.objects.values("status", "errors", "attempts").get(id=bad_id)
    assert record["status"] == TaskResultStatus.FAILED
    assert record["errors"][-1]["exception_class_path"] == CORRUPT_TASK
    assert "args" in record["errors"][-1]["traceback"]
    assert record["attempts"] <= 1
    _assert_all_succeeded(others)


@pytest.mark.django_db(transaction=True)
def test_a_task_that_forks_a_child_that_returns_does_not_hold_up_the_worker(
    worker_process: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    """The child of a careless ``os.fork()`` returns from the task too: it ends there, writes
    no outcome, and a ``--burst`` worker exits."""
    path = tmp_path / "child"
    result = tasks_wedges.fork_and_return.enqueue(str(path))
    others = _others(5)
    worker = worker_process("--burst")
    assert worker.wait(timeout=30) == 0, worker.output
    record = TaskRecord.objects.get(id=result.id)
    assert record.status == TaskResultStatus.SUCCESSFUL
    child = int(path.read_text())
    assert record.return_value == child > 0
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
    _assert_all_succeeded(others)
