"""Pruning finished tasks: by age and status, in batches, dry runs, and the command."""

from __future__ import annotations

import uuid
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import EventRecord, TaskRecord
from django_sqltasks.store.pruning import prune
from tests.factories import task_row

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


def remaining() -> set[str]:
    return {str(pk) for pk in TaskRecord.objects.values_list("pk", flat=True)}


def test_prune_keeps_failed_longer_and_never_touches_unfinished() -> None:
    old_ok = task_row(TaskResultStatus.SUCCESSFUL, finished_ago=15 * DAY)
    new_ok = task_row(TaskResultStatus.SUCCESSFUL, finished_ago=13 * DAY)
    mid_failed = task_row(TaskResultStatus.FAILED, finished_ago=15 * DAY)
    old_failed = task_row(TaskResultStatus.FAILED, finished_ago=31 * DAY)
    ready = task_row(TaskResultStatus.READY, enqueued_at=task_row().enqueued_at - 60 * DAY)
    running = task_row(TaskResultStatus.RUNNING)
    pruned = prune(using="default")
    assert (pruned.successful, pruned.failed) == (1, 1)
    kept = {new_ok, mid_failed, ready, running}
    assert {str(t.pk) for t in kept} <= remaining()
    assert str(old_ok.pk) not in remaining() and str(old_failed.pk) not in remaining()


def test_dry_run_deletes_nothing() -> None:
    task_row(TaskResultStatus.SUCCESSFUL, finished_ago=20 * DAY)
    before = remaining()
    assert prune(using="default", dry_run=True).successful == 1
    assert remaining() == before


def test_prune_deletes_in_batches_by_primary_key() -> None:
    for _ in range(7):
        task_row(TaskResultStatus.SUCCESSFUL, finished_ago=20 * DAY)
    with CaptureQueriesContext(connection) as queries:
        pruned = prune(using="default", batch_size=3, failed_days=None)
    assert pruned.successful == 7
    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 3  # 3 + 3 + 1
    assert TaskRecord.objects.count() == 0


def test_max_batches_bounds_one_call() -> None:
    for _ in range(5):
        task_row(TaskResultStatus.FAILED, finished_ago=40 * DAY)
    assert prune(using="default", batch_size=2, max_batches=1).failed == 2
    assert TaskRecord.objects.count() == 3


def test_prune_one_queue() -> None:
    task_row(TaskResultStatus.SUCCESSFUL, finished_ago=20 * DAY, queue_name="other")
    keep = task_row(TaskResultStatus.SUCCESSFUL, finished_ago=20 * DAY, queue_name="default")
    assert prune(using="default", queue="other").successful == 1
    assert remaining() == {str(keep.pk)}


def test_command_with_options() -> None:
    task_row(TaskResultStatus.SUCCESSFUL, finished_ago=3 * DAY)
    task_row(TaskResultStatus.FAILED, finished_ago=3 * DAY)
    out = StringIO()
    call_command("tasks_prune", "--days", "2", "--failed-days", "5", "--dry-run", stdout=out)
    assert "Would delete 1 task(s): 1 successful" in out.getvalue()
    assert TaskRecord.objects.count() == 2
    call_command("tasks_prune", "--days=2", "--failed-days=2", stdout=out)
    assert "Deleted 2 task(s)" in out.getvalue()
    assert TaskRecord.objects.count() == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--days", "-1"], "must be zero or more days"),
        (["--batch-size", "0"], "must be at least 1"),
        (["--backend", "immediate"], "is not a django_sqltasks SQLTaskBackend"),
        (["--backend", "nope"], "--backend"),
    ],
)
def test_command_rejects_bad_input(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("tasks_prune", *args)


def test_retention_prunes_then_waits_for_its_interval() -> None:
    from django_sqltasks.store.pruning import Retention

    task_row(TaskResultStatus.SUCCESSFUL, finished_ago=3 * DAY)
    task_row(TaskResultStatus.FAILED, finished_ago=3 * DAY)
    retention = Retention(backend="default", using="default", successful_days=2, failed_days=None)
    assert retention.due()
    assert (retention.run().successful, TaskRecord.objects.count()) == (1, 1)
    assert not retention.due()


def test_retention_comes_from_the_options() -> None:
    from django_sqltasks import SQLTaskBackend
    from django_sqltasks.core.options import OptionError
    from django_sqltasks.store.pruning import Retention

    def backend(**options: object) -> SQLTaskBackend:
        return SQLTaskBackend(
            "x", {"BACKEND": "django_sqltasks.SQLTaskBackend", "OPTIONS": options}
        )

    assert Retention.for_backend(backend()) is None
    retention = Retention.for_backend(backend(PRUNE_FAILED_DAYS=30))
    assert retention is not None
    assert (retention.successful_days, retention.failed_days) == (None, 30)
    retention = Retention.for_backend(backend(PRUNE_UNCLAIMED_EVENT_DAYS=7))
    assert retention is not None
    assert (retention.successful_days, retention.unclaimed_event_days) == (None, 7)
    assert isinstance(backend(PRUNE_SUCCESSFUL_DAYS=-1).options_error, OptionError)
    assert "PRUNE_SUCCESSFUL_DAYS" in str(backend(PRUNE_SUCCESSFUL_DAYS="7").options_error)


def test_command_refuses_a_queue_outside_queues() -> None:
    message = r"--queue: 'nosuch' is not a queue of backend 'default', whose QUEUES are: default"
    with pytest.raises(CommandError, match=message):
        call_command("tasks_prune", "--queue", "nosuch")


@pytest.mark.parametrize(
    ("queue", "message"),
    [("q\x00", "must not contain control characters"), ("q\udcff", "must be valid UTF-8")],
)
def test_command_refuses_a_queue_name_no_task_can_have(queue: str, message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("tasks_prune", "--queue", queue)


def test_command_says_when_no_task_is_in_the_queue(settings: Any) -> None:
    settings.TASKS = {**settings.TASKS, "default": {**settings.TASKS["default"], "QUEUES": []}}
    task_row(TaskResultStatus.SUCCESSFUL, queue_name="emails", finished_ago=3 * DAY)
    out, err = StringIO(), StringIO()
    call_command("tasks_prune", "--queue", "emials", stdout=out, stderr=err)
    assert err.getvalue().strip() == "No task of backend 'default' is in queue 'emials'."
    assert out.getvalue().startswith("Deleted 0 task(s)")
    call_command("tasks_prune", "--queue", "emails", "--days", "1", stdout=out, stderr=err)
    assert "Deleted 1 task(s)" in out.getvalue() and err.getvalue().count("No task") == 1


@pytest.mark.django_db(transaction=True)  # the day partitions are seen from the command's reads
def test_a_prune_that_keeps_the_cutoffs_day_says_so_and_exact_deletes_it() -> None:
    """On PostgreSQL the old tasks of the day the cutoff falls in go with that day's partition:
    ``--days 0`` deleted nothing and said only "Deleted 0 task(s)"."""
    task_row(TaskResultStatus.SUCCESSFUL, finished_ago=timedelta(0))  # the cutoff's day
    out = StringIO()
    call_command("tasks_prune", "--days", "0", stdout=out)
    if connection.vendor != "postgresql":  # one table: deleted now
        assert "Deleted 1 task(s)" in out.getvalue()
        return
    assert "Deleted 0 task(s)" in out.getvalue()
    assert (
        "day's partition after" in out.getvalue() and "--exact deletes them now" in out.getvalue()
    )
    out = StringIO()
    call_command("tasks_prune", "--days", "0", "--exact", stdout=out)
    assert "Deleted 1 task(s)" in out.getvalue() and "--exact" not in out.getvalue()


def _events_sent(days_ago: float, count: int, awaited: bool = False) -> None:
    """``count`` events sent ``days_ago``: for a key no task waits for, or taken (``awaited``)."""
    sent = timezone.now() - timedelta(days=days_ago)
    EventRecord.objects.bulk_create(
        EventRecord(
            name="order.paid",
            key=f"{days_ago}-{awaited}-{i}",
            sent_at=sent,
            task_id=uuid.uuid4() if awaited else None,
        )
        for i in range(count)
    )


def test_a_workers_retention_prunes_unclaimed_events_by_their_own_setting() -> None:
    """Events sent for nobody were pruned only by a prune() call with no backend, which
    neither tasks_prune nor a worker's retention made: every one stayed for ever."""
    from django_sqltasks.store.pruning import Retention

    _events_sent(10, 3)
    _events_sent(10, 2, awaited=True)  # taken by their task: its pruning deletes them
    _events_sent(1, 2)
    retention = Retention(
        backend="default",
        using="default",
        successful_days=None,
        failed_days=None,
        unclaimed_event_days=7,
    )
    assert retention.run().events == 3
    left = EventRecord.objects.order_by("key").values_list("key", flat=True)
    assert list(left) == ["1-False-0", "1-False-1", "10-True-0", "10-True-1"]


def test_command_prunes_unclaimed_events_but_not_for_one_queue() -> None:
    _events_sent(20, 2)
    out = StringIO()
    call_command("tasks_prune", "--queue", "default", stdout=out)
    assert EventRecord.objects.count() == 2
    call_command("tasks_prune", "--dry-run", stdout=out)
    assert "Would delete 2 unclaimed event(s) sent over 14 days ago." in out.getvalue()
    call_command("tasks_prune", "--unclaimed-event-days", "30", stdout=out)
    assert EventRecord.objects.count() == 2
    call_command("tasks_prune", stdout=out)
    assert "Deleted 2 unclaimed event(s) sent over 14 days ago." in out.getvalue()
    assert EventRecord.objects.count() == 0
