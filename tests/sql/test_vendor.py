"""The facts of each database (``sql/vendor.py``): its version, errors, clock and limits."""

from __future__ import annotations

import uuid

import pytest
from django.db import DatabaseError, connection, transaction

from django_sqltasks.sql import Outcome, unsupported_version
from django_sqltasks.sql.dialect import Dialect
from django_sqltasks.sql.rows import (
    RESULT_COLUMNS,
)
from tests.factories import task_row


@pytest.mark.django_db
def test_facts(dialect: Dialect) -> None:
    assert dialect.wakeup in {"notify", "files", "poll"}
    assert dialect.single_writer is (connection.vendor == "sqlite")
    assert unsupported_version("default") is None
    assert dialect.version_problem() is None
    assert dialect._too_old((1, 0), (2, 0)).endswith("needs " + dialect.product + " 2.0 or newer.")


@pytest.mark.django_db
def test_ping_result_select_and_error_kinds(dialect: Dialect) -> None:
    row = task_row()
    with connection.cursor() as cursor:
        dialect.ping(cursor)
        cursor.execute(
            dialect.select_result_sql(RESULT_COLUMNS), [dialect._encode_id(row.id), "default"]
        )
        values = dict(zip(RESULT_COLUMNS, cursor.fetchone(), strict=True))
        assert values["status"] == "READY"
        assert values["task_path"] == row.task_path
        with pytest.raises(DatabaseError) as refused:
            cursor.execute("SELECT no_such_column FROM django_sqltasks_nothing")
    assert not dialect.is_transient(refused.value)
    assert not dialect.is_contention(refused.value)


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="a PostgreSQL session's fact")
def test_a_write_refused_as_read_only_is_transient(dialect: Dialect) -> None:
    """A session on a server that takes no writes (a primary fenced for a switchover, a
    standby reached without ``target_session_attrs``) is dropped, and the call tried again on
    a new connection, which libpq sends to the server that takes writes."""
    task_row()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION READ ONLY")
        with pytest.raises(DatabaseError) as refused, transaction.atomic():
            cursor.execute(f"UPDATE {dialect.tasks} SET priority = 1")
    assert dialect.is_read_only(refused.value)
    assert dialect.is_transient(refused.value)
    assert not dialect.is_contention(refused.value)


@pytest.mark.django_db
def test_table_health_location_and_statement_limits(dialect: Dialect) -> None:
    with connection.cursor() as cursor:
        health = dialect.table_health(cursor)
    if connection.vendor == "sqlite":
        assert not health.known
    else:
        assert health.known
        assert health.live_rows is None or health.live_rows >= 0
    assert dialect.location()
    limit = dialect.max_statement_bytes()
    small = Outcome(id=uuid.uuid4(), status="SUCCESSFUL", finished_at=None, return_value="1")
    assert dialect.outcome_problem(small) is None
    if limit is None:
        assert connection.vendor != "mysql"
    else:
        huge = Outcome(
            id=uuid.uuid4(), status="SUCCESSFUL", finished_at=None, return_value="1" * limit
        )
        problem = dialect.outcome_problem(huge)
        assert problem is not None and "max_allowed_packet" in problem


@pytest.mark.django_db
def test_a_missing_table_is_told_apart_from_other_errors(dialect: Dialect) -> None:
    with connection.cursor() as cursor, pytest.raises(DatabaseError) as missing:
        cursor.execute("SELECT 1 FROM django_sqltasks_no_such_table")
    assert dialect.names_missing_table(missing.value)
    assert dialect.names_missing_table(missing.value.__cause__ or missing.value)
    assert not dialect.names_missing_table(ValueError("no such table"))
