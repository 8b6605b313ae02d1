"""A call that meets a transient error reconnects and runs again; the log says which kind it
met. A lock conflict (MySQL's "Deadlock found", a lock wait timeout, a busy SQLite file) was
rolled back and retried, nothing lost: it is logged at INFO as that, not as a fault."""

from __future__ import annotations

import logging
import sqlite3
import threading
import uuid

import pytest
from django.db import connection, connections

from django_sqltasks.models import TaskRecord
from django_sqltasks.sql.retries import run_with_retries
from tests.factories import task_row
from tests.lost_connections import SHORT_LOCK_TIMEOUT, Retried

pytestmark = pytest.mark.django_db(transaction=True)


def _hold_lock(task_id: str | uuid.UUID, locked: threading.Event, until: threading.Event) -> None:
    """Lock the row of ``task_id`` (SQLite: the file) from another connection until ``until``."""
    if connection.vendor == "sqlite":
        raw = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        try:
            raw.execute("BEGIN IMMEDIATE")
            locked.set()
            until.wait(30)
            raw.execute("COMMIT")
        finally:
            raw.close()
        return
    other = connections.create_connection("default")
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            table = TaskRecord._meta.db_table
            cursor.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [task_id])
            locked.set()
            until.wait(30)
        other.commit()
    finally:
        other.close()


def test_a_lock_conflict_is_logged_as_rolled_back_and_retried_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    row = task_row()
    handler = Retried()  # its event, set at the first retry, ends the other's lock
    locked = threading.Event()
    pk: str | uuid.UUID = row.pk.hex if connection.vendor != "postgresql" else row.pk
    holder = threading.Thread(target=_hold_lock, args=(pk, locked, handler.event))
    logger = logging.getLogger("django_sqltasks")
    logger.addHandler(handler)
    try:
        holder.start()
        assert locked.wait(30), "the other connection never took its lock"
        with connection.cursor() as cursor:
            cursor.execute(SHORT_LOCK_TIMEOUT[connection.vendor])

        def write() -> int:
            return TaskRecord.objects.filter(pk=row.pk).update(priority=7)

        with caplog.at_level(logging.INFO, logger="django_sqltasks"):
            assert run_with_retries("default", write, about="in a test") == 1
    finally:
        handler.event.set()
        holder.join()
        logger.removeHandler(handler)
    first = next(r for r in caplog.records if getattr(r, "action", None) == "db_retry")
    assert first.levelno == logging.INFO, first.getMessage()
    assert first.getMessage().startswith(
        "Lock conflict with another transaction in a test (attempt 1): this try was rolled back"
    )
    assert getattr(first, "contention", False)
    assert TaskRecord.objects.get(pk=row.pk).priority == 7
