"""``TaskQuery``: filters, counts, and cancel / retry / delete of what matches, in batches."""

from __future__ import annotations

import datetime as dt
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, connections
from django.utils import timezone

from django_sqltasks import TaskQuery
from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.exceptions import InvalidTaskQuery
from django_sqltasks.models import TaskRecord
from django_sqltasks.store import control
from tests import tasks
from tests.factories import insert_rows, plan_uses, task_row
from tests.test_indexes import analyze, explain

pytestmark = pytest.mark.django_db

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


@pytest.fixture
def rows() -> dict[str, TaskRecord]:
    now = timezone.now()
    user = User.objects.create(username="ada")
    return {
        "ready": task_row(enqueued_at=now - timedelta(hours=3)),
        "ready_other": task_row(queue_name="other", task_path="tests.tasks.noop"),
        "ready_about": task_row(subject_type="auth.user", subject_id=str(user.pk)),
        "running": task_row(RUNNING, enqueued_at=now - timedelta(hours=2)),
        "ok_old": task_row(
            SUCCESSFUL, finished_ago=timedelta(days=10), enqueued_at=now - timedelta(days=10)
        ),
        "ok_new": task_row(SUCCESSFUL, finished_ago=timedelta(minutes=5)),
        "failed": task_row(FAILED, queue_name="other", finished_ago=timedelta(days=2)),
        "failed_noop": task_row(FAILED, task_path="tests.tasks.noop", finished_ago=timedelta(1)),
    }


def names(query: TaskQuery, rows: dict[str, TaskRecord]) -> set[str]:
    ids = set(query.queryset().values_list("pk", flat=True))
    assert query.count() == len(ids)
    return {name for name, row in rows.items() if row.pk in ids}


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({}, {"ready", "ready_other", "ready_about", "running", "ok_old", "ok_new", "failed",
              "failed_noop"}),
        ({"state": "FAILED"}, {"failed", "failed_noop"}),
        ({"state": ["ready", TaskResultStatus.RUNNING]},
         {"ready", "ready_other", "ready_about", "running"}),
        ({"queue": "other"}, {"ready_other", "failed"}),
        ({"queue": ["other"], "state": "READY"}, {"ready_other"}),
        ({"task": tasks.noop}, {"ready_other", "failed_noop"}),
        ({"task": ["tests.tasks.noop", tasks.add], "state": "FAILED"}, {"failed", "failed_noop"}),
        ({"enqueued_before": timedelta(hours=1)}, {"ready", "running", "ok_old"}),
        ({"enqueued_after": timedelta(hours=2, minutes=30), "state": "READY"},
         {"ready_other", "ready_about"}),
        ({"finished_after": timedelta(days=3)}, {"ok_new", "failed", "failed_noop"}),
        ({"finished_before": timedelta(days=1, hours=12)}, {"ok_old", "failed"}),
        ({"finished_after": timedelta(days=3), "finished_before": timedelta(hours=1)},
         {"failed", "failed_noop"}),
    ],
)  # fmt: skip
def test_filters(rows: dict[str, TaskRecord], filters: dict[str, Any], expected: set[str]) -> None:
    assert names(TaskQuery(**filters), rows) == expected


def test_subject_and_an_aware_datetime(rows: dict[str, TaskRecord]) -> None:
    assert names(TaskQuery(subject=User.objects.get(username="ada")), rows) == {"ready_about"}
    moment = rows["ok_new"].finished_at
    assert moment is not None
    paris = dt.timezone(timedelta(hours=1))
    assert names(TaskQuery(finished_after=moment.astimezone(paris)), rows) == {"ok_new"}
    assert names(TaskQuery(finished_before=moment), rows) == {"ok_old", "failed", "failed_noop"}


def test_another_backend_is_another_set(rows: dict[str, TaskRecord]) -> None:
    task_row(backend_name="elsewhere")
    assert TaskQuery().count() == len(rows)


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        ({"state": "DONE"}, "state: 'DONE' is not a task state (one of READY, RUNNING, "),
        ({"state": []}, "state: an empty list matches no task"),
        ({"queue": ""}, "queue: must be a non-empty name, not ''"),
        ({"queue": ["a", 3]}, "queue: must be a non-empty name, not 3"),
        ({"task": print}, "task: must be a Task or its dotted path"),
        ({"backend": "nope"}, "backend: "),
        ({"backend": "immediate"}, "backend: 'immediate' is not a django_sqltasks"),
        ({"subject": "user 3"}, "subject: subject must be a saved model instance"),
        ({"enqueued_before": datetime(2026, 1, 1)}, "enqueued_before: 2026-01-01T00:00:00 is a "
         "naive datetime, which names no moment; give an aware one"),
        ({"finished_after": "yesterday"}, "finished_after: must be a datetime or a timedelta"),
        ({"finished_after": timedelta(days=-1)}, "finished_after: a timedelta means that long "
         "ago; -1 day, 0:00:00 is negative"),
        ({"enqueued_after": datetime(2026, 2, 1, tzinfo=UTC),
          "enqueued_before": datetime(2026, 1, 1, tzinfo=UTC)},
         "enqueued_after (2026-02-01T00:00:00+00:00) is not before enqueued_before"),
    ],
)  # fmt: skip
def test_bad_filters_name_the_filter_and_the_rule(filters: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidTaskQuery) as caught:
        TaskQuery(**filters)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("size", [0, -1, 10_001, 2.5, True, "10"])
def test_a_bad_batch_size_is_refused(size: Any) -> None:
    with pytest.raises(InvalidTaskQuery, match="batch_size: must be a whole number from 1 to"):
        TaskQuery().delete(batch_size=size)


def test_cancel_in_batches(rows: dict[str, TaskRecord]) -> None:
    retried = task_row(errors=[{"exception_class_path": "builtins.ValueError", "traceback": "x"}])
    done = TaskQuery(queue="default").cancel(reason="Flood of bad tasks.", batch_size=2)
    assert (done.cancelled, done.stop_requested, done.total) == (3, 1, 4)
    for row in (rows["ready"], rows["ready_about"], retried):
        row.refresh_from_db()
        assert row.status == FAILED and row.finished_at is not None
        assert row.errors[-1] == {
            "exception_class_path": "django_sqltasks.exceptions.TaskCancelled",
            "traceback": "Flood of bad tasks.",
        }
    assert len(retried.errors) == 2  # the earlier error is kept
    rows["running"].refresh_from_db()
    assert rows["running"].status == RUNNING and rows["running"].cancel_requested
    rows["ready_other"].refresh_from_db()
    assert rows["ready_other"].status == READY  # another queue
    again = TaskQuery(queue="default").cancel()
    assert (again.cancelled, again.stop_requested) == (0, 0)  # nothing left to cancel or ask
    assert TaskQuery(state="READY").cancel(running=False).cancelled == 1


def test_retry_in_batches_keeps_id_errors_and_attempts(rows: dict[str, TaskRecord]) -> None:
    more = [task_row(FAILED, finished_ago=timedelta(hours=i)) for i in range(1, 4)]
    assert TaskQuery(state="FAILED", queue="default").retry(batch_size=2) == 4
    for row in [rows["failed_noop"], *more]:
        row.refresh_from_db()
        assert row.status == READY and row.finished_at is None and row.owner is None
        assert row.attempts == 1 and row.errors[0]["exception_class_path"] == "builtins.ValueError"
    rows["failed"].refresh_from_db()
    assert rows["failed"].status == FAILED  # queue "other"
    assert TaskQuery(state="FAILED", queue="default").retry() == 0


def test_a_retry_a_newer_live_task_dedupes_stays_failed(rows: dict[str, TaskRecord]) -> None:
    old = task_row(FAILED, finished_ago=timedelta(hours=1), dedupe_key="k")
    task_row(dedupe_key="k")  # live: it holds the key
    assert TaskQuery(state="FAILED").retry(batch_size=10) == 2  # failed and failed_noop
    old.refresh_from_db()
    assert old.status == FAILED


def test_delete_only_finished_in_batches(rows: dict[str, TaskRecord]) -> None:
    assert TaskQuery(finished_before=timedelta(hours=1)).delete(batch_size=1) == 3
    assert set(TaskRecord.objects.values_list("pk", flat=True)) == {
        rows[name].pk for name in ("ready", "ready_other", "ready_about", "running", "ok_new")
    }
    assert TaskQuery(state=["READY", "RUNNING"]).delete() == 0  # cancel them first
    assert TaskQuery().count() == 5


# ANALYZE TABLE commits on MariaDB and MySQL: a test of its own transaction, flushed after.
@pytest.mark.django_db(transaction=True)
def test_the_estimated_count_is_about_the_count() -> None:
    for i in range(300):
        task_row(SUCCESSFUL if i % 3 else FAILED, finished_ago=timedelta(minutes=i))
    analyze()
    exact = TaskQuery(state="SUCCESSFUL").count()
    assert exact == 200
    estimate = TaskQuery(state="SUCCESSFUL").estimated_count()
    if connection.vendor == "sqlite":
        assert estimate == exact  # no estimate there: counted
    else:
        assert 100 <= estimate <= 400, estimate


@pytest.mark.skipif("connection.vendor == 'sqlite'", reason="SQLite locks the whole database")
@pytest.mark.django_db(transaction=True)
def test_a_row_locked_elsewhere_is_passed_by_not_waited_for() -> None:
    """A batch skips the rows another transaction holds (a worker claiming them), so a cancel
    never queues behind a claim."""
    locked, free = task_row(), task_row()
    other = connections.create_connection("default")
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            table = TaskRecord._meta.db_table
            key = TaskRecord._meta.pk.get_db_prep_value(locked.pk, other)
            cursor.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [key])
            assert TaskQuery().cancel().cancelled == 1
        other.rollback()
    finally:
        other.close()
    locked.refresh_from_db()
    free.refresh_from_db()
    assert (locked.status, free.status) == (READY, FAILED)


def test_importable_from_the_package() -> None:
    import django_sqltasks

    assert "TaskQuery" in django_sqltasks.__all__
    assert control.CANCELLED == "django_sqltasks.exceptions.TaskCancelled"
    assert repr(TaskQuery(state="READY")).startswith("<TaskQuery ")


def test_tags() -> None:
    vip = task_row(tags=["vip", "customer:42"])
    task_row(tags=["vip"])
    task_row(tags=["Vip"])  # another tag: tags are compared exactly
    task_row()  # untagged: NULL
    enqueued = tasks.tagged.using(tags=["vip", "late"]).enqueue("order-1")
    assert TaskQuery(tag="vip").count() == 3
    assert TaskQuery(tag="Vip").count() == 1
    assert set(TaskQuery(tag=["customer:42", "late"]).queryset().values_list("pk", flat=True)) == {
        vip.pk,
        uuid.UUID(str(enqueued.id)),
    }
    assert TaskQuery(tag="billing").count() == 0  # the task's own tags were replaced by using()
    assert TaskQuery(tag="vip", state="READY").cancel().cancelled == 3


@pytest.mark.parametrize(
    ("tag", "message"),
    [
        ("a b", "tag: 'a b' is not a tag (1 to 64 letters, digits or _ . : / @ = + -)"),
        ("", "tag: '' is not a tag"),
        ("t" * 65, "is not a tag (1 to 64"),
        ('"x"', "is not a tag"),
        (["ok", 3], "tag: 3 is not a tag"),
        ([], "tag: an empty list matches no task"),
    ],
)
def test_a_bad_tag_is_refused(tag: Any, message: str) -> None:
    with pytest.raises(InvalidTaskQuery) as caught:
        TaskQuery(tag=tag)
    assert message in str(caught.value)


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the tag index is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_the_tag_filter_reads_the_tag_index() -> None:
    template = TaskRecord(
        task_path="tests.tasks.noop", backend_name="default", queue_name="default"
    )
    insert_rows(template, 5000, lambda i: {"tags": ["vip"] if i % 1000 == 0 else None})
    analyze()
    plan = explain(*TaskQuery(tag="vip").queryset().order_by().query.sql_with_params())
    assert plan_uses(plan, "sqltasks_tags_idx"), plan
