"""OPTIONS CLAIM_SYNCHRONOUS_COMMIT: False turns PostgreSQL's synchronous_commit off for the
claim's own transaction, and SQLite's synchronous down to NORMAL for the claim's statements, and
for nothing else (enqueues, outcomes and requeues stay durable)."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.db import OperationalError, connection, transaction

from django_sqltasks import send_event
from django_sqltasks.compat import TaskResultStatus, task_backends
from django_sqltasks.core.durable import SentEvent
from django_sqltasks.core.options import BackendOptions, OptionError
from django_sqltasks.models import TaskRecord
from django_sqltasks.sql import dialect_for
from django_sqltasks.worker import Worker
from tests import tasks, tasks_durable
from tests.conftest import set_backend_options, worker_thread
from tests.events import EventLog, Gate

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="runs in the PostgreSQL leg of the suite"
)
sqlite_only = pytest.mark.skipif(
    connection.vendor != "sqlite", reason="runs in the SQLite leg of the suite"
)
FULL = 2  # SQLite's default synchronous level: a WAL commit waits for its fsync


@pytest.mark.parametrize("value", [0, "off", None, "False"])
def test_a_value_other_than_true_or_false_is_refused_naming_the_option(value: Any) -> None:
    with pytest.raises(OptionError, match=r"\['CLAIM_SYNCHRONOUS_COMMIT'\] must be True or False"):
        BackendOptions.parse("default", {"CLAIM_SYNCHRONOUS_COMMIT": value})


def test_the_system_check_reports_a_bad_value(settings: Any) -> None:
    set_backend_options(settings, CLAIM_SYNCHRONOUS_COMMIT="off")
    errors = [e for e in task_backends["default"].check() if e.id == "django_sqltasks.E002"]
    assert len(errors) == 1 and isinstance(errors[0], checks.Error)
    assert "CLAIM_SYNCHRONOUS_COMMIT" in errors[0].msg


def _claim_sql() -> str:
    sql, _ = dialect_for(connection).claim_sql(
        backend_name="default", queue_names=None, worker_id="w", limit=10
    )
    return sql


def _show() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        value: str = cursor.fetchone()[0]
    return value


@postgres_only
def test_by_default_the_claims_commit_does_not_wait_for_its_flush() -> None:
    assert "set_config('synchronous_commit', 'off', true)" in _claim_sql()


@postgres_only
def test_true_leaves_synchronous_commit_alone(settings: Any) -> None:
    set_backend_options(settings, CLAIM_SYNCHRONOUS_COMMIT=True)
    assert "synchronous_commit" not in _claim_sql()


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_off_applies_inside_the_claims_transaction_only(settings: Any) -> None:
    set_backend_options(settings, CLAIM_SYNCHRONOUS_COMMIT=False)
    tasks.noop.enqueue()
    sql, params = dialect_for(connection).claim_sql(
        backend_name="default", queue_names=None, worker_id="w", limit=10
    )
    assert _show() == "on"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        document, *_, setting = cursor.fetchone()
        assert document is not None and setting == "off"
        assert _show() == "off"  # SET LOCAL: the rest of the claim's transaction
    assert _show() == "on"  # and no further: the session's next statements are durable
    assert TaskRecord.objects.get().status == TaskResultStatus.RUNNING


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_worker_claims_and_stores_outcomes_with_it_off(
    settings: Any, run_worker: Callable[..., Worker]
) -> None:
    set_backend_options(settings, CLAIM_SYNCHRONOUS_COMMIT=False)
    assert "set_config('synchronous_commit', 'off', true)" in _claim_sql()
    results = [tasks.add.enqueue(i, 1) for i in range(20)]
    run_worker()
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    assert _show() == "on"


def _sqlite_level() -> int:
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA synchronous")
        level: int = cursor.fetchone()[0]
    return level


def _claim_seeing_levels() -> tuple[list[Any], list[tuple[str, int]]]:
    """Claim on this connection, as a worker's database thread does; return the rows, and the
    level of every statement of the claim that wrote (its UPDATE), as SQLite had it then."""
    seen: list[tuple[str, int]] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.lstrip().upper().startswith("UPDATE"):
            raw = connection.connection.execute("PRAGMA synchronous").fetchone()[0]
            seen.append(("UPDATE", raw))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record), connection.cursor() as cursor:
        rows = dialect_for(connection).claim(
            cursor, backend_name="default", queue_names=None, worker_id="w", limit=10
        )
    return rows, seen


@sqlite_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("option", [False, True])
def test_sqlite_claims_commit_at_normal_and_the_connection_keeps_its_level(
    settings: Any, option: bool
) -> None:
    set_backend_options(settings, CLAIM_SYNCHRONOUS_COMMIT=option)
    # Two priorities: two claim statements, each committed alone.
    results = [tasks.noop.enqueue(), tasks.noop.using(priority=5).enqueue()]
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA synchronous = {FULL}")  # SQLite's default
    rows, seen = _claim_seeing_levels()
    assert sorted(str(r.id) for r in rows) == sorted(r.id for r in results)
    assert seen == [("UPDATE", FULL if option else 1)] * 2
    assert _sqlite_level() == FULL  # the connection's next commit waits for its fsync again
    tasks.noop.enqueue()
    assert _sqlite_level() == FULL


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_a_sqlite_claim_that_fails_leaves_the_connection_at_its_level(settings: Any) -> None:
    """The claim meets the write lock another connection holds past the busy timeout: it
    fails (transient, retried by the worker), and the connection is back at its level."""
    set_backend_options(settings, CLAIM_SYNCHRONOUS_COMMIT=False)
    tasks.noop.enqueue()
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA synchronous = {FULL}")
        cursor.execute("PRAGMA busy_timeout = 50")
    other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(OperationalError, match="locked"):
            _claim_seeing_levels()
        other.execute("ROLLBACK")
    finally:
        other.close()
    assert _sqlite_level() == FULL
    rows, seen = _claim_seeing_levels()
    assert len(rows) == 1 and seen == [("UPDATE", 1)]


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_a_sqlite_claim_inside_a_transaction_keeps_the_level(settings: Any) -> None:
    """SQLite cannot change the level inside a transaction: the claim keeps it, and works."""
    set_backend_options(settings, CLAIM_SYNCHRONOUS_COMMIT=False)
    tasks.noop.enqueue()
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA synchronous = {FULL}")
    with transaction.atomic():
        rows, seen = _claim_seeing_levels()
    assert len(rows) == 1 and seen == [("UPDATE", FULL)]
    assert _sqlite_level() == FULL


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_a_sqlite_connection_already_at_normal_or_off_is_left_alone(settings: Any) -> None:
    set_backend_options(settings, CLAIM_SYNCHRONOUS_COMMIT=False)
    for level in (1, 0):
        tasks.noop.enqueue()
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA synchronous = {level}")
        rows, seen = _claim_seeing_levels()
        assert len(rows) == 1 and seen == [("UPDATE", level)]
        assert _sqlite_level() == level


@pytest.mark.django_db(transaction=True)
def test_a_task_claimed_again_while_it_runs_is_not_started_twice(
    tmp_path: Path, events: EventLog, gate: Gate
) -> None:
    """A server crash that loses a claim's commit leaves its row READY while the worker runs
    its task; the worker may claim it again. It does not start it a second time: the first
    attempt's outcome settles the row, which is RUNNING and this worker's again."""
    path = tmp_path / "runs"
    result = tasks.touch_then_wait_at.enqueue(str(path), gate.path)
    worker = Worker(concurrency=2, queue_names=["*"])
    with worker_thread(worker):
        events.wait("note", what="start", timeout=30)
        # What the lost commit leaves: the row as it was before the claim.
        TaskRecord.objects.filter(id=result.id).update(
            status=TaskResultStatus.READY, owner=None, attempts=0, worker_ids=[]
        )
        # A task enqueued after it, which the worker claims after the older one (one free
        # slot): once it has run, the older one was claimed again.
        tasks.noop.enqueue().wait(timeout=30)
        again = TaskRecord.objects.get(id=result.id)
        assert (again.status, again.owner, again.attempts) == ("RUNNING", worker.worker_id, 1)
        gate.open()
        result.wait(timeout=30)
    record = TaskRecord.objects.get(id=result.id)
    assert record.status == TaskResultStatus.SUCCESSFUL
    assert record.owner is None and record.attempts == 1
    assert len(path.read_text().splitlines()) == 1  # it ran once


@pytest.mark.django_db(transaction=True)
def test_a_durable_task_claimed_again_before_its_attempt_ends_runs_on(tmp_path: Path) -> None:
    """A task stopped at a wait is READY once the wait's transaction commits, a moment before
    its attempt ends and lets the slot go. An event sent in that moment makes it due, and the
    worker may claim it while it still holds the attempt: that claim is the task's next run,
    and starts when the attempt ends (nothing else would start it: the row is RUNNING and
    this worker's, whose lease stays alive)."""
    reclaimed = threading.Event()

    class Between(logging.Handler):
        """Holds the stopped attempt (on its thread, as it logs its stop) until the worker
        has claimed its task again."""

        def handle(self, record: logging.LogRecord) -> bool:  # not emit: it holds a lock
            action = getattr(record, "action", None)
            if action == "claimed_again":
                reclaimed.set()
            elif action == "task_suspended" and not reclaimed.is_set():
                assert send_event("order.paid", "between", "paid") == SentEvent.RESUMED
                assert reclaimed.wait(30), "the worker did not claim the task again"
            return True

    handler = Between(logging.INFO)
    logger = logging.getLogger("django_sqltasks")
    # The handler acts on INFO records, which a worker command run in this process before
    # (tasks_worker -v 0) may have turned off on this logger.
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        result = tasks_durable.waiter.enqueue(str(tmp_path / "log"), "order.paid", "between")
        with worker_thread(Worker(concurrency=2, queue_names=["*"])):
            result.wait(timeout=30)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert reclaimed.is_set()
    record = TaskRecord.objects.get(id=result.id)
    assert (record.status, record.return_value) == (TaskResultStatus.SUCCESSFUL, "paid")
    assert tasks_durable.effects(tmp_path / "log") == ["before", "after:between"]
