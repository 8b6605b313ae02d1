"""The backend: enqueue, validation, results, transactions."""

from __future__ import annotations

import math
import uuid
from datetime import date, datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_sqltasks import SQLTaskBackend
from django_sqltasks.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)
from django_sqltasks.exceptions import InvalidTaskArguments, PayloadTooLarge
from django_sqltasks.models import TaskRecord
from tests import tasks
from tests.conftest import set_backend_options

pytestmark = pytest.mark.django_db


def test_backend_is_importable_from_package_and_module() -> None:
    from django_sqltasks.backend import SQLTaskBackend as FromModule

    assert SQLTaskBackend is FromModule
    assert isinstance(task_backends["default"], SQLTaskBackend)


def test_capability_flags_are_all_supported() -> None:
    backend = task_backends["default"]
    assert backend.supports_defer
    assert backend.supports_async_task
    assert backend.supports_get_result
    assert backend.supports_priority


def test_enqueue_writes_one_row_with_one_query() -> None:
    # MariaDB reads max_allowed_packet once per connection, at its first enqueue.
    tasks.add.enqueue(0, 0)
    with CaptureQueriesContext(connection) as queries:
        result = tasks.add.enqueue(1, 2)
    assert len(queries) == 1
    record = TaskRecord.objects.get(id=result.id)
    assert record.task_path == "tests.tasks.add"
    assert record.status == TaskResultStatus.READY
    assert record.args == [1, 2]
    assert record.kwargs == {}
    assert record.queue_name == "default"
    assert record.backend_name == "default"
    assert record.priority == 0
    assert record.attempts == 0
    assert record.worker_ids == []
    assert record.errors == []
    # Due by the database's clock (this process's on SQLite): the enqueue's time, give or take.
    assert abs(record.available_at - record.enqueued_at) < timedelta(seconds=1)


def test_enqueue_returns_a_complete_ready_result() -> None:
    before = timezone.now()
    result = tasks.echo.enqueue("a", (1, 2), b=b"bytes")
    assert result.status == TaskResultStatus.READY
    assert result.backend == "default"
    assert result.task.func is tasks.echo.func
    assert before <= result.enqueued_at <= timezone.now()
    assert result.started_at is None and result.finished_at is None
    assert result.last_attempted_at is None
    assert result.args == ["a", [1, 2]]
    assert result.kwargs == {"b": "bytes"}
    assert result.errors == [] and result.worker_ids == [] and result.attempts == 0
    assert uuid.UUID(result.id).version == 7
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value


def test_ids_are_unique_and_time_ordered() -> None:
    ids = [tasks.noop.enqueue().id for _ in range(50)]
    assert len(set(ids)) == 50
    assert ids == sorted(ids)


def test_enqueue_sends_task_enqueued_with_backend_class_as_sender() -> None:
    received: list[tuple[Any, Any]] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        received.append((sender, task_result))

    task_enqueued.connect(receiver)
    try:
        result = tasks.noop.enqueue()
    finally:
        task_enqueued.disconnect(receiver)
    assert received == [(SQLTaskBackend, result)]


def test_get_result_round_trips_every_field() -> None:
    enqueued = tasks.add.using(priority=5, queue_name="other").enqueue(2, 3)
    fetched = tasks.add.get_result(enqueued.id)
    assert fetched.id == enqueued.id
    assert fetched.status == TaskResultStatus.READY
    assert fetched.args == [2, 3]
    assert fetched.task.priority == 5
    assert fetched.task.queue_name == "other"
    assert fetched.enqueued_at == enqueued.enqueued_at
    assert fetched.backend == "default"


@pytest.mark.parametrize(
    "bad_id",
    ["nope", "", "0" * 100, pytest.param(str(uuid.uuid4()), id="unknown-uuid")],
)
def test_get_result_of_unknown_or_malformed_id_raises(bad_id: str) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(bad_id)


@pytest.mark.django_db(transaction=True)
async def test_aenqueue_and_aget_result() -> None:
    result = await tasks.async_add.aenqueue(4, 5)
    fetched = await tasks.async_add.aget_result(result.id)
    assert fetched.id == result.id
    assert fetched.args == [4, 5]
    await result.arefresh()
    assert result.status == TaskResultStatus.READY
    # The thread that ran the queries keeps its connection; close it before teardown.
    await sync_to_async(connections.close_all)()


def test_refresh_reads_the_current_state() -> None:
    result = tasks.add.enqueue(1, 1)
    TaskRecord.objects.filter(id=result.id).update(
        status=TaskResultStatus.SUCCESSFUL, return_value=2, finished_at=timezone.now()
    )
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 2


def test_run_after_is_stored_and_delays_availability() -> None:
    when = timezone.now() + timedelta(hours=1)
    result = tasks.noop.using(run_after=when).enqueue()
    record = TaskRecord.objects.get(id=result.id)
    assert record.run_after == when
    assert record.available_at == when
    assert tasks.noop.get_result(result.id).task.run_after == when
    assert not TaskRecord.objects.due().filter(id=result.id).exists()
    assert TaskRecord.objects.scheduled().filter(id=result.id).exists()


class TestValidation:
    def test_naive_run_after_is_refused(self) -> None:
        with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
            tasks.noop.using(run_after=datetime(2030, 1, 1))

    @pytest.mark.parametrize("priority", [101, -101])
    def test_priority_out_of_range_is_refused(self, priority: int) -> None:
        with pytest.raises(InvalidTask, match="priority must be a whole number"):
            tasks.noop.using(priority=priority)

    def test_unknown_queue_is_refused(self) -> None:
        with pytest.raises(InvalidTask) as caught:
            tasks.noop.using(queue_name="nope")
        # Django's sentence, then the backend and its queues, which Django's does not name.
        assert str(caught.value) == (
            "Queue 'nope' is not valid for backend. TASKS['default']['QUEUES'] lists "
            "'default', 'other', 'slow': add it there, or use one of those."
        )

    def test_validation_runs_again_at_enqueue(self, settings: Any) -> None:
        task = tasks.noop.using(queue_name="other")
        settings.TASKS = {
            **settings.TASKS,
            "default": {**settings.TASKS["default"], "QUEUES": ["default"]},
        }
        with pytest.raises(InvalidTask, match="Queue 'other' is not valid"):
            task.enqueue()
        assert not TaskRecord.objects.exists()

    @pytest.mark.parametrize(
        ("args", "kwargs", "message"),
        [
            ((date(2024, 1, 1),), {}, r"Task argument args\[0\] is a datetime.date"),
            ((), {"when": datetime(2024, 1, 1)}, r"kwargs\['when'\] is a datetime.datetime"),
            (([1, {"deep": {1, 2}}],), {}, r"args\[0\]\[1\]\['deep'\] is a builtins.set"),
            (({1: "a"},), {}, r"args\[0\] has the key 1 of type int"),
            ((math.nan,), {}, r"args\[0\] is nan"),
            ((), {"x": math.inf}, r"kwargs\['x'\] is inf"),
            ((2**70,), {}, r"args\[0\] is an integer outside the signed 64-bit range"),
            ((-1e300,), {}, r"args\[0\] is -1e\+300, a float of magnitude 2\*\*63 or more"),
            ((2.0**63,), {}, r"args\[0\] is 9.223372036854776e\+18, a float of magnitude"),
            ((b"\xff",), {}, r"args\[0\] is bytes that are not valid UTF-8"),
            ((object(),), {}, r"args\[0\] is a builtins.object"),
        ],
    )
    def test_arguments_that_are_not_json_are_refused_by_name(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], message: str
    ) -> None:
        with pytest.raises(InvalidTaskArguments, match=message):
            tasks.echo.enqueue(*args, **kwargs)
        assert not TaskRecord.objects.exists()

    def test_argument_errors_are_type_errors(self) -> None:
        with pytest.raises(TypeError):
            tasks.echo.enqueue(date.today())

    def test_payload_over_the_limit_is_refused(self) -> None:
        with pytest.raises(PayloadTooLarge, match="over the MAX_PAYLOAD_BYTES limit"):
            tasks.echo.enqueue("x" * (1024 * 1024 + 1))
        assert not TaskRecord.objects.exists()

    def test_large_payload_under_the_limit_is_stored(self) -> None:
        result = tasks.echo.enqueue("x" * 500_000)
        assert TaskRecord.objects.get(id=result.id).args == ["x" * 500_000]


@pytest.mark.django_db(transaction=True)
class TestTransactions:
    def test_enqueue_inside_a_committed_transaction_persists(self) -> None:
        with transaction.atomic():
            result = tasks.noop.enqueue()
        assert TaskRecord.objects.filter(id=result.id).exists()

    def test_enqueue_inside_a_rolled_back_transaction_vanishes(self) -> None:
        class Rollback(Exception):
            pass

        ids: list[str] = []

        def enqueue_then_fail() -> None:
            with transaction.atomic():
                ids.append(tasks.noop.enqueue().id)
                assert TaskRecord.objects.filter(id=ids[0]).exists()
                raise Rollback

        with pytest.raises(Rollback):
            enqueue_then_fail()
        result_id = ids[0]
        assert not TaskRecord.objects.filter(id=result_id).exists()
        with pytest.raises(TaskResultDoesNotExist):
            tasks.noop.get_result(result_id)

    def test_row_is_invisible_to_other_connections_until_commit(self) -> None:
        other = connections.create_connection("default")
        try:
            with transaction.atomic():
                result = tasks.noop.enqueue()
                with other.cursor() as cursor:
                    cursor.execute(
                        f"SELECT COUNT(*) FROM {TaskRecord._meta.db_table} WHERE status = %s",
                        ["READY"],
                    )
                    assert cursor.fetchone()[0] == 0
            with other.cursor() as cursor:
                cursor.execute(f"SELECT COUNT(*) FROM {TaskRecord._meta.db_table}")
                assert cursor.fetchone()[0] == 1
            assert tasks.noop.get_result(result.id).status == TaskResultStatus.READY
        finally:
            other.close()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
class TestNotify:
    def listen(self) -> Any:
        import psycopg

        params = connection.get_connection_params()
        for key in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(key, None)
        listener = psycopg.connect(**params, autocommit=True)
        listener.execute("LISTEN sqltasks")
        return listener

    def test_enqueue_notifies_at_commit_and_not_on_rollback(self) -> None:
        listener = self.listen()
        try:

            def enqueue_then_roll_back() -> None:
                with transaction.atomic():
                    tasks.noop.enqueue()
                    raise RuntimeError("roll back")

            with pytest.raises(RuntimeError):
                enqueue_then_roll_back()
            assert list(listener.notifies(timeout=0.3)) == []
            with transaction.atomic():
                tasks.other_queue.enqueue()
                assert list(listener.notifies(timeout=0.3)) == []  # not before commit
            received = [n.payload for n in listener.notifies(timeout=1, stop_after=1)]
            assert received == ["other"]
        finally:
            listener.close()

    def test_notify_option_off_sends_nothing(self, settings: Any) -> None:
        set_backend_options(settings, NOTIFY=False)
        listener = self.listen()
        try:
            tasks.noop.enqueue()
            assert list(listener.notifies(timeout=0.3)) == []
        finally:
            listener.close()
