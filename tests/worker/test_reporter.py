"""Progress and metadata: what a running task reports through its context, written at most
once per heartbeat and at the end of the attempt, read back through get_result; on every
database, through a real worker."""

from __future__ import annotations

import math
import signal
from collections.abc import Callable
from typing import Any

import pytest

from django_sqltasks.compat import TaskResultStatus, task_backends
from django_sqltasks.core.progress import (
    MAX_METADATA_BYTES,
    MAX_NOTE_CHARS,
    AttemptReport,
    ProgressReport,
)
from django_sqltasks.models import TaskRecord
from django_sqltasks.task import SQLTaskResult
from django_sqltasks.worker import Worker
from tests import tasks_progress
from tests.conftest import set_backend_options, worker_thread
from tests.events import EventLog, Gate

pytestmark = pytest.mark.django_db

RunWorker = Callable[..., Worker]


@pytest.mark.django_db(transaction=True)
def test_a_sync_task_reports_progress_and_metadata(run_worker: RunWorker) -> None:
    result = tasks_progress.report_steps.enqueue(1000)
    worker = run_worker()
    fresh = task_backends["default"].get_result(result.id)
    assert isinstance(fresh, SQLTaskResult)
    assert fresh.status == TaskResultStatus.SUCCESSFUL
    assert fresh.progress == 1.0
    assert fresh.progress_note == "step 1000 of 1000"
    assert dict(fresh.metadata) == {"steps": 1000, "done": True}
    assert fresh.progress_updated_at is not None
    # 1001 calls, one write: the calls are coalesced in memory.
    assert worker._reporter.counts() == (1, 0)


@pytest.mark.django_db(transaction=True)
def test_an_async_task_reports_progress_and_metadata(run_worker: RunWorker) -> None:
    result = tasks_progress.async_report.enqueue()
    run_worker()
    fresh = tasks_progress.async_report.get_result(result.id)
    assert fresh.return_value == "half"  # a note is kept when set_progress gives none
    assert (fresh.progress, fresh.progress_note) == (1.0, "half")
    assert dict(fresh.metadata) == {"pages": 3, "kind": "pdf"}


@pytest.mark.django_db(transaction=True)
def test_a_running_task_s_report_is_written_at_the_heartbeat(
    settings: Any, events: EventLog, gate: Gate
) -> None:
    set_backend_options(settings, HEARTBEAT_INTERVAL=0.2, LEASE_TIMEOUT=5)
    result = tasks_progress.report_then_wait.enqueue(gate.path)
    with worker_thread(Worker(queue_names=["*"], concurrency=2)):
        running = events.until(
            lambda: (r := task_backends["default"].get_result(result.id)).progress and r,
            "the report, written at a heartbeat",
        )
        assert running.status == TaskResultStatus.RUNNING
        assert (running.progress, running.progress_note) == (0.25, "waiting")
        assert dict(running.metadata) == {"stage": "wait"}
        gate.open()
        events.wait("task_finished", id=str(result.id), status="SUCCESSFUL")
    running.refresh()  # our refresh() copies the report too
    assert (running.progress, running.progress_note) == (0.75, "done waiting")


@pytest.mark.django_db(transaction=True)
def test_reports_are_kept_per_attempt(settings: Any, run_worker: RunWorker) -> None:
    set_backend_options(settings, MAX_ATTEMPTS=2, RETRY_BACKOFF=0)
    result = tasks_progress.report_and_fail.enqueue()
    run_worker()
    row = TaskRecord.objects.get(pk=result.id)
    assert row.status == TaskResultStatus.FAILED
    assert row.progress["attempt"] == 2  # the second attempt's report replaced the first's
    fresh = task_backends["default"].get_result(result.id)
    assert (fresh.progress, fresh.progress_note) == (0.3, "attempt 2")
    # A new attempt has no report until it makes one: the last one belongs to attempt 2.
    TaskRecord.objects.filter(pk=result.id).update(worker_ids=[*row.worker_ids, "other"])
    fresh.refresh()
    assert (fresh.progress, fresh.progress_note, dict(fresh.metadata)) == (None, "", {})


@pytest.mark.django_db(transaction=True)
def test_a_snoozed_attempt_s_report_is_not_written_over_the_next(run_worker: RunWorker) -> None:
    result = tasks_progress.report_and_snooze.enqueue()
    run_worker()
    fresh = task_backends["default"].get_result(result.id)
    assert fresh.status == TaskResultStatus.READY
    # Written before the outcome, while the row was still this attempt's.
    assert (fresh.progress, fresh.progress_note) == (0.9, "snoozing")


@pytest.mark.django_db(transaction=True)
def test_text_no_database_stores_is_escaped_and_large_integers_kept(
    run_worker: RunWorker,
) -> None:
    result = tasks_progress.report_hostile.enqueue()
    run_worker()
    fresh = task_backends["default"].get_result(result.id)
    assert fresh.status == TaskResultStatus.SUCCESSFUL
    assert fresh.progress_note == "nul \\x00 and lone \\udc80 surrogate"
    assert fresh.metadata == {"k\\x00": "v\\ud800", "big": 2**62, "nested": {"list": ["\\x00"]}}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("nan", "progress must be a finite number from 0 to 1, not nan."),
        ("huge", "progress must be a finite number from 0 to 1, not 1e+300."),
        ("note", f"note must be at most {MAX_NOTE_CHARS} characters, not 1000."),
        ("metadata", "metadata['value'] is inf, which JSON cannot represent."),
        # PostgreSQL's jsonb would give 1e300 back as an integer of 301 digits.
        (
            "big",
            "metadata['big'] is 1e+300, a float of magnitude 2**63 or more, which PostgreSQL's "
            "JSON gives back as an integer outside the signed 64-bit range; pass it as a string.",
        ),
    ],
)
def test_bad_input_fails_the_attempt_naming_the_rule(
    kind: str, message: str, run_worker: RunWorker
) -> None:
    result = tasks_progress.report_bad.enqueue(kind)
    run_worker()
    row = TaskRecord.objects.get(pk=result.id)
    assert row.status == TaskResultStatus.FAILED
    assert message in row.errors[-1]["traceback"]
    assert row.progress is None


@pytest.mark.django_db(transaction=True)
def test_a_task_that_reports_nothing_writes_nothing(run_worker: RunWorker) -> None:
    result = tasks_progress.plain_context.enqueue()
    worker = run_worker()
    row = TaskRecord.objects.get(pk=result.id)
    assert (row.status, row.return_value, row.progress) == ("SUCCESSFUL", 1, None)
    assert worker._reporter.counts() == (0, 0)
    fresh = task_backends["default"].get_result(result.id)
    assert (fresh.progress, fresh.progress_note, dict(fresh.metadata)) == (None, "", {})


@pytest.mark.django_db(transaction=True)
def test_a_failing_write_neither_fails_the_task_nor_stops_the_worker(
    run_worker: RunWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_sqltasks.core.progress import ProgressReport

    def broken(self: ProgressReport) -> dict[str, Any]:
        raise RuntimeError("the write failed")

    monkeypatch.setattr(ProgressReport, "to_json", broken)
    first = tasks_progress.report_steps.enqueue(3)
    second = tasks_progress.report_steps.enqueue(2)
    worker = run_worker(concurrency=1)
    assert TaskRecord.objects.get(pk=first.id).status == "SUCCESSFUL"
    assert TaskRecord.objects.get(pk=second.id).return_value == 2
    assert worker._reporter.counts() == (0, 2)


def test_values_are_checked_at_the_call() -> None:
    report = AttemptReport("id", 1, None)
    with pytest.raises(TypeError, match="progress must be a number from 0 to 1, not '1'"):
        report.set_progress("1")
    with pytest.raises(TypeError, match="progress must be a number"):
        report.set_progress(True)
    with pytest.raises(ValueError, match=r"not -0\.1"):
        report.set_progress(-0.1)
    with pytest.raises(TypeError, match="note must be a string"):
        report.set_progress(0.1, 5)
    with pytest.raises(ValueError, match=f"at most {MAX_METADATA_BYTES:,} bytes"):
        report.set_metadata(blob="x" * MAX_METADATA_BYTES)
    with pytest.raises(ValueError, match="JSON object keys must be strings"):
        report.set_metadata({1: "one"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="not JSON-serializable"):
        report.set_metadata(when=object())
    with pytest.raises(TypeError, match="metadata must be a dict"):
        report.set_metadata([("a", 1)])
    assert report.take() is None  # nothing was recorded
    report.set_progress(1)
    taken = report.take()
    assert taken is not None and taken.progress == 1.0 and math.isfinite(taken.progress)
    assert report.take() is None  # taken once


def test_a_damaged_stored_report_reads_as_none() -> None:
    assert ProgressReport.from_json({"attempt": "x"}) is None
    assert ProgressReport.from_json("not json") is None
    assert ProgressReport.from_json([1, 2]) is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker_process
def test_reports_are_written_by_the_processes_of_a_supervisor(
    worker_process: Callable[..., Any], events: EventLog, gate: Gate
) -> None:
    waiting = tasks_progress.report_then_wait.enqueue(gate.path)
    steps = tasks_progress.report_steps.enqueue(10)
    supervisor = worker_process(
        "--processes",
        "2",
        "-c",
        "2",
        env={"SQLTASKS_LEASE_TIMEOUT": "3", "SQLTASKS_HEARTBEAT_INTERVAL": "0.25"},
    )
    try:
        # Written by the child's heartbeat while the task runs, then at its end.
        events.until(
            lambda: TaskRecord.objects.get(pk=waiting.id).progress, "the report, at a heartbeat"
        )
        gate.open()
        for result in (waiting, steps):
            events.wait("task_finished", id=str(result.id), status="SUCCESSFUL")
    finally:
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0, supervisor.output
    backend = task_backends["default"]
    assert backend.get_result(waiting.id).progress_note == "done waiting"
    assert backend.get_result(steps.id).progress == 1.0


@pytest.mark.django_db(transaction=True)
def test_aget_result_reads_the_report_and_the_subject(run_worker: RunWorker) -> None:
    from asgiref.sync import async_to_sync
    from django.contrib.auth.models import User

    from django_sqltasks.core.subject import Subject
    from django_sqltasks.task import with_subject

    user = User.objects.create(username="ada")
    result = with_subject(tasks_progress.report_steps, user).enqueue(2)
    run_worker()
    fresh = async_to_sync(task_backends["default"].aget_result)(result.id)  # native on PostgreSQL
    assert isinstance(fresh, SQLTaskResult)
    assert (fresh.progress, fresh.progress_note) == (1.0, "step 2 of 2")
    assert dict(fresh.metadata) == {"steps": 2, "done": True}
    assert fresh.subject == Subject(type="auth.user", id=str(user.pk))


@pytest.mark.django_db(transaction=True)
def test_a_report_whose_write_failed_is_written_at_a_later_heartbeat(
    settings: Any, events: EventLog, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import DatabaseError

    from django_sqltasks.worker import reporter

    set_backend_options(settings, HEARTBEAT_INTERVAL=0.2, LEASE_TIMEOUT=5)
    real_store = reporter.store
    failures: list[Any] = []

    def flaky_store(database: str, worker_id: str, report: AttemptReport) -> bool:
        if len(failures) < 2:
            failures.append(report.task_id)
            report.take()  # as a real write would, before the database refused it
            report.untake()
            raise DatabaseError("the database refused the write")
        return real_store(database, worker_id, report)

    monkeypatch.setattr(reporter, "store", flaky_store)
    result = tasks_progress.report_then_wait.enqueue(gate.path)
    worker = Worker(queue_names=["*"], concurrency=2)
    with worker_thread(worker):
        events.until(lambda: TaskRecord.objects.get(pk=result.id).progress, "the report")
        # The write is counted once it has returned, after the row shows it: wait for both.
        events.until(lambda: worker._reporter.counts()[0], "the report's write counted")
        assert len(failures) == 2  # two heartbeats' writes failed; the third one wrote it
        assert worker._reporter.counts() == (1, 2)
        gate.open()
        events.wait("task_finished", id=str(result.id), status="SUCCESSFUL")
    assert task_backends["default"].get_result(result.id).progress_note == "done waiting"
