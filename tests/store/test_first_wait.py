"""A task's first wait for an event, as its task thread makes it: parked (the task READY until
the event or the timeout, its attempt given back, the wait's record, the event's row its own),
given the payload of an event sent before, refused a key another task waits for, refused a
park once the attempt no longer holds the task. The same on every database; on PostgreSQL the
park is one statement (sql/postgresql.py's park_at_event), elsewhere a transaction."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_sqltasks import send_event
from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.core.durable import SentEvent
from django_sqltasks.exceptions import EventAlreadyAwaited, Suspended
from django_sqltasks.models import EventRecord, StepRecord, TaskRecord
from django_sqltasks.sql import dialect_for
from django_sqltasks.sql.rows import parked_at
from django_sqltasks.store.steps import database_now
from django_sqltasks.store.waits import AttemptSteps
from tests.conftest import wait_for
from tests.factories import task_row

pytestmark = pytest.mark.django_db(transaction=True)

ONE_STATEMENT = connection.vendor == "postgresql"


@pytest.fixture
def running() -> TaskRecord:
    """A task its worker w1 claimed once: RUNNING, its first attempt."""
    return task_row(
        TaskResultStatus.RUNNING, task_path="tests.tasks_durable.waiter", worker_ids=["w1"]
    )


def steps_of(record: TaskRecord, *, attempt: int = 1, claims: int = 1) -> AttemptSteps:
    return AttemptSteps(
        task_id=record.pk, owner="w1", attempt=attempt, claims=claims, backend_name="default"
    )


def test_the_dialect_says_whether_it_parks_in_one_statement() -> None:
    assert dialect_for(connection).parks_in_one_statement is ONE_STATEMENT


@pytest.mark.parametrize("timeout", [None, 3600.0])
def test_a_first_wait_parks_the_task_until_its_event(
    running: TaskRecord, timeout: float | None
) -> None:
    steps = steps_of(running)
    before = database_now("default")
    with CaptureQueriesContext(connection) as queries, pytest.raises(Suspended) as stopped:
        steps.wait_for_event("order.paid", "k1", timeout)
    after = database_now("default")
    if ONE_STATEMENT:
        assert len(queries) == 1, [q["sql"] for q in queries]
    task = TaskRecord.objects.get(pk=running.pk)
    assert (task.status, task.owner, task.attempts) == ("READY", None, 0)
    (record,) = StepRecord.objects.filter(task_id=running.pk)
    assert (record.kind, record.name, record.occurrence) == ("event", "order.paid", 0)
    assert (record.state, record.event_key, record.attempts) == ("waiting", "k1", 0)
    assert before <= record.started_at <= after
    if timeout is None:
        assert record.wake_at is None
        assert task.available_at == parked_at()
    else:
        assert record.wake_at is not None
        assert before + timedelta(seconds=timeout) <= record.wake_at
        assert record.wake_at <= after + timedelta(seconds=timeout)
        assert task.available_at == record.wake_at
    assert stopped.value.until == task.available_at
    assert "waiting for event 'order.paid' with key 'k1'" in stopped.value.reason
    event = EventRecord.objects.get(name="order.paid", key="k1")
    assert (event.task_id, event.sent_at, event.payload) == (running.pk, None, None)
    # The event comes: it goes to this task, which it makes due.
    assert send_event("order.paid", "k1", {"paid": 1}) == SentEvent.RESUMED
    assert TaskRecord.objects.get(pk=running.pk).available_at < parked_at()


def test_a_first_wait_takes_an_event_sent_before_it(running: TaskRecord) -> None:
    assert send_event("order.paid", "k2", {"paid": 2}) == SentEvent.STORED
    assert steps_of(running).wait_for_event("order.paid", "k2", None) == {"paid": 2}
    task = TaskRecord.objects.get(pk=running.pk)
    assert (task.status, task.owner, task.attempts) == ("RUNNING", "w1", 1)
    (record,) = StepRecord.objects.filter(task_id=running.pk)
    assert (record.state, record.result, record.event_key) == ("done", {"paid": 2}, "k2")
    assert EventRecord.objects.get(name="order.paid", key="k2").task_id == running.pk


def test_a_first_wait_for_a_key_another_task_waits_for_is_refused(running: TaskRecord) -> None:
    other = task_row(
        TaskResultStatus.RUNNING, task_path="tests.tasks_durable.waiter", worker_ids=["w1"]
    )
    with pytest.raises(Suspended):
        steps_of(other).wait_for_event("order.paid", "k3", None)
    with pytest.raises(EventAlreadyAwaited, match=str(other.pk)):
        steps_of(running).wait_for_event("order.paid", "k3", None)
    task = TaskRecord.objects.get(pk=running.pk)
    assert (task.status, task.owner, task.attempts) == ("RUNNING", "w1", 1)
    assert not StepRecord.objects.filter(task_id=running.pk).exists()
    assert EventRecord.objects.get(name="order.paid", key="k3").task_id == other.pk


@pytest.mark.parametrize(
    ("attempt", "claims"),
    [
        (2, 1),  # an attempt number the task is not at
        (1, 2),  # a claim before a park: the task was claimed again since
    ],
)
def test_a_first_wait_parks_nothing_once_the_attempt_no_longer_holds_the_task(
    running: TaskRecord, attempt: int, claims: int
) -> None:
    with pytest.raises(Suspended) as stopped:
        steps_of(running, attempt=attempt, claims=claims).wait_for_event("order.paid", "k4", 60)
    assert "no longer held by this worker" in stopped.value.reason
    task = TaskRecord.objects.get(pk=running.pk)
    assert (task.status, task.owner, task.attempts) == ("RUNNING", "w1", 1)
    assert not StepRecord.objects.filter(task_id=running.pk).exists()


def test_a_first_wait_of_a_task_held_by_another_worker_parks_nothing(running: TaskRecord) -> None:
    steps = AttemptSteps(
        task_id=running.pk, owner="w2", attempt=1, claims=1, backend_name="default"
    )
    with pytest.raises(Suspended) as stopped:
        steps.wait_for_event("order.paid", "k5", None)
    assert "no longer held by this worker" in stopped.value.reason
    assert TaskRecord.objects.get(pk=running.pk).status == "RUNNING"
    assert not StepRecord.objects.filter(task_id=running.pk).exists()


@pytest.mark.skipif(not ONE_STATEMENT, reason="the statements of PostgreSQL's send and park")
def test_a_send_that_waited_for_a_park_to_commit_makes_the_parked_task_due(
    running: TaskRecord,
) -> None:
    """The park holds the event's row when the send comes: the send waits for it, and then
    sees the task parked (its second statement reads after the first's lock wait) and makes
    it due; one statement would have read the task as RUNNING, before the park, and left it
    parked for ever."""
    # The key's row is there already (a wait before timed out, say): the park locks it.
    EventRecord.objects.create(name="order.paid", key="k6")
    parked, commit = threading.Event(), threading.Event()
    outcome: list[SentEvent] = []

    def park() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                assert dialect_for(connection).park_at_event(
                    cursor,
                    task_id=running.pk,
                    owner="w1",
                    attempt=1,
                    claims=1,
                    name="order.paid",
                    key="k6",
                    occurrence=0,
                    timeout=None,
                )
                parked.set()
                assert commit.wait(30)
        finally:
            connection.close()

    def send() -> None:
        try:
            outcome.append(send_event("order.paid", "k6", {"paid": 6}))
        finally:
            connection.close()

    parker = threading.Thread(target=park)
    parker.start()
    assert parked.wait(30)
    sender = threading.Thread(target=send)
    sender.start()
    with connection.cursor() as cursor:  # the send waits for the park's lock on the row

        def send_waits() -> bool:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND query LIKE %s",
                ["%UPDATE%eventrecord%"],
            )
            return bool(cursor.fetchone()[0])

        wait_for(send_waits)
    commit.set()
    parker.join(30)
    sender.join(30)
    assert outcome == [SentEvent.RESUMED]
    task = TaskRecord.objects.get(pk=running.pk)
    assert task.status == "READY" and task.available_at < parked_at()
    assert EventRecord.objects.get(name="order.paid", key="k6").payload == {"paid": 6}


def test_a_send_to_a_parked_waiter_makes_it_due_in_few_statements(running: TaskRecord) -> None:
    with pytest.raises(Suspended):
        steps_of(running).wait_for_event("order.paid", "k7", None)
    with CaptureQueriesContext(connection) as queries:
        assert send_event("order.paid", "k7", [7]) == SentEvent.RESUMED
    if ONE_STATEMENT:  # BEGIN, the event's row, the task and its NOTIFY, COMMIT
        assert len(queries) <= 4, [q["sql"] for q in queries]
    task = TaskRecord.objects.get(pk=running.pk)
    assert task.status == "READY" and task.available_at < parked_at()
    assert EventRecord.objects.get(name="order.paid", key="k7").payload == [7]
    assert send_event("order.paid", "k7", [8]) == SentEvent.ALREADY_SENT
    assert EventRecord.objects.get(name="order.paid", key="k7").payload == [7]
