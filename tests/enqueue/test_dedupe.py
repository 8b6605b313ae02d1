"""Deduplication: one live task per key, enforced by the database under concurrency."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connections

from django_sqltasks.compat import TaskResultStatus, task_backends
from django_sqltasks.models import TaskRecord
from django_sqltasks.worker import Worker
from tests import tasks

pytestmark = pytest.mark.django_db


def test_second_enqueue_returns_the_live_task() -> None:
    first = tasks.refresh_report.enqueue(7)
    second = tasks.refresh_report.enqueue(7)
    other = tasks.refresh_report.enqueue(8)
    assert second.id == first.id
    assert other.id != first.id
    assert TaskRecord.objects.count() == 2


def test_a_custom_key_ignores_the_other_arguments() -> None:
    first = tasks.sync_user.enqueue(1, reason="signup")
    second = tasks.sync_user.enqueue(1, reason="profile edit")
    assert second.id == first.id
    assert second.kwargs == {"reason": "signup"}  # the live task, as it was enqueued


@pytest.mark.django_db(transaction=True)
def test_a_finished_task_frees_its_key(run_worker: Callable[..., Worker]) -> None:
    first = tasks.refresh_report.enqueue(7)
    run_worker()
    assert tasks.refresh_report.get_result(first.id).status == TaskResultStatus.SUCCESSFUL
    second = tasks.refresh_report.enqueue(7)
    assert second.id != first.id


def test_a_running_task_still_holds_its_key() -> None:
    first = tasks.refresh_report.enqueue(7)
    TaskRecord.objects.filter(id=first.id).update(status=TaskResultStatus.RUNNING, owner="w")
    assert tasks.refresh_report.enqueue(7).id == first.id


@pytest.mark.django_db(transaction=True)
def test_concurrent_enqueues_make_one_task() -> None:
    ids: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def enqueue() -> None:
        try:
            barrier.wait()
            ids.append(tasks.refresh_report.enqueue(99).id)
        except BaseException as e:
            errors.append(e)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueue) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(set(ids)) == 1
    assert TaskRecord.objects.filter(dedupe_key__isnull=False).count() == 1


@pytest.mark.django_db(transaction=True)
async def test_aenqueue_deduplicates_too() -> None:
    from asgiref.sync import sync_to_async

    first = await tasks.refresh_report.aenqueue(5)
    second = await tasks.refresh_report.aenqueue(5)
    assert second.id == first.id
    await sync_to_async(connections.close_all)()


def test_enqueue_many_deduplicates_each_call() -> None:
    results = task_backends["default"].enqueue_many(
        tasks.refresh_report, [((1,), {}), ((2,), {}), ((1,), {})]
    )
    assert results[2].id == results[0].id
    assert TaskRecord.objects.count() == 2


def test_tasks_without_dedupe_are_never_merged() -> None:
    assert tasks.add.enqueue(1, 1).id != tasks.add.enqueue(1, 1).id


def test_keys_are_scoped_to_backend_and_task_and_fit_the_column() -> None:
    from django_sqltasks.core.policy import dedupe_key

    key = dedupe_key(tasks.sync_user, [1], {})
    assert key == "default:tests.tasks.sync_user:user-1"
    long = dedupe_key(tasks.sync_user, ["x" * 300], {})
    assert long is not None and len(long) <= 255 and long.startswith("sha256:")


def test_retrying_a_failed_task_whose_key_is_taken_is_skipped() -> None:
    from django_sqltasks.store import control

    old = tasks.refresh_report.enqueue(3)
    TaskRecord.objects.filter(id=old.id).update(status=TaskResultStatus.FAILED)
    newer = tasks.refresh_report.enqueue(3)
    assert newer.id != old.id
    retried = control.retry(TaskRecord.objects.filter(id=old.id), using="default")
    assert retried == []
    assert TaskRecord.objects.get(id=old.id).status == TaskResultStatus.FAILED
