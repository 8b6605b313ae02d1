"""The task table's upkeep (issue 20): autovacuum off, dead rows, an old transaction.

Each condition is made for real, and seen where an operator looks: the database checks,
``tasks_status``, the admin's overview page and the metrics.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.test import Client
from django.urls import reverse

from django_sqltasks import checks, health
from django_sqltasks.models import TaskRecord

TABLE = TaskRecord._meta.db_table
HEALTH_IDS = {"django_sqltasks.W003", "django_sqltasks.W004", "django_sqltasks.W005"}


@dataclass
class Seen:
    """What each place an operator looks at says about the task table."""

    check_ids: set[str]
    status: str
    page: str
    metrics: Any  # a prometheus_client registry, or None without the package

    def warning_metric(self, code: str) -> float | None:
        if self.metrics is None:
            return None
        labels = {"database": "default", "warning": code}
        value: float | None = self.metrics.get_sample_value("sqltasks_table_warning", labels)
        return value

    def assert_warns(self, check_id: str, code: str) -> None:
        """The warning is in the checks, tasks_status, the overview page and the metric."""
        assert check_id in self.check_ids
        assert f"WARNING {check_id}" in self.status
        assert f'data-check="{check_id}"' in self.page
        assert self.warning_metric(code) in (None, 1)


def look(client: Client) -> Seen:
    found = checks.check_table_health(databases=["default"])
    status = StringIO()
    call_command("tasks_status", "--plain", stdout=status)
    page = client.get(reverse("admin:django_sqltasks_queueoverview_changelist"))
    assert page.status_code == 200
    registry = None
    if health_metrics_available():
        from django_sqltasks.metrics import Metrics

        registry = Metrics("default").registry
        registry.get_sample_value("sqltasks_workers")  # one collection: the reading
    return Seen({str(m.id) for m in found}, status.getvalue(), page.content.decode(), registry)


def health_metrics_available() -> bool:
    from django_sqltasks.metrics import available

    return available()


def server_autovacuum_off() -> bool:
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        return bool(cursor.fetchone()[0] == "off")


def old_transaction_seen() -> bool:
    return any(w.code == "old_transaction" for w in health.warnings(health.read()))


@pytest.fixture
def operator(client: Client, django_user_model: Any) -> Client:
    client.force_login(django_user_model.objects.create_superuser("ops", "o@example.com", "pw"))
    return client


@pytest.mark.django_db(transaction=True)  # VACUUM cannot run inside a transaction
def test_a_healthy_table_gives_no_warning(operator: Client) -> None:
    if connection.vendor == "postgresql":
        # Rows of earlier tests, rolled back or deleted, are dead rows too: with autovacuum
        # off, as on some test servers, they would be a real W004.
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM {TABLE}")
    seen = look(operator)
    # A PostgreSQL server with autovacuum off everywhere is itself the case to warn about.
    expected = {"django_sqltasks.W003"} if server_autovacuum_off() else set()
    assert seen.check_ids & HEALTH_IDS == expected
    assert ("WARNING" in seen.status) == bool(expected)
    assert ('id="sqltasks-health"' in seen.page) == bool(expected)
    if seen.metrics is not None:
        assert seen.warning_metric("dead_rows") == 0
        assert seen.warning_metric("old_transaction") == 0
    if connection.vendor == "sqlite":
        assert not health.read().known  # nothing to warn about: no vacuum horizon
        assert "Task table" not in seen.status


def test_warnings_need_the_database() -> None:
    assert list(checks.check_table_health(databases=None)) == []


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="autovacuum is PostgreSQL's")
@pytest.mark.django_db
def test_autovacuum_off_for_the_task_table_warns(operator: Client) -> None:
    with connection.cursor() as cursor:
        # Rolled back with the test's transaction.
        cursor.execute(f"ALTER TABLE {TABLE} SET (autovacuum_enabled = false)")
    seen = look(operator)
    seen.assert_warns("django_sqltasks.W003", "autovacuum_off")
    assert "autovacuum OFF" in seen.status and "autovacuum_enabled" in seen.status
    if seen.metrics is not None:
        enabled = seen.metrics.get_sample_value(
            "sqltasks_table_autovacuum_enabled", {"database": "default"}
        )
        assert enabled == 0


@pytest.fixture
def autovacuum_off_for_the_table() -> Iterator[None]:
    """Autovacuum off for the task table, committed (the test runs in autocommit)."""
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE} SET (autovacuum_enabled = false)")
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE} RESET (autovacuum_enabled)")


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="n_dead_tup is PostgreSQL's")
@pytest.mark.django_db(transaction=True)  # dead rows are counted once their deletion commits
def test_dead_rows_outnumbering_live_ones_warn(
    operator: Client, autovacuum_off_for_the_table: None
) -> None:
    dead = health.DEAD_ROWS_FLOOR + 2000
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {TABLE} (id, task_path, backend_name, queue_name, priority, status,
                args, kwargs, errors, worker_ids, attempts, enqueued_at, available_at)
            SELECT gen_random_uuid(), 'tests.tasks.noop', 'default', 'default', 0, 'READY',
                '[]', '{{}}', '[]', '[]', 0, now(), now()
            FROM generate_series(1, %s)
            """,
            [dead],
        )
        cursor.execute(f"DELETE FROM {TABLE}")
    # The server's statistics take the deletion in within a second or so.
    deadline = time.monotonic() + 15
    while (health.read().dead_rows or 0) < dead and time.monotonic() < deadline:
        time.sleep(0.2)
    seen = look(operator)
    seen.assert_warns("django_sqltasks.W004", "dead_rows")
    assert "dead rows" in seen.status
    if seen.metrics is not None:
        labels = {"database": "default", "state": "dead"}
        assert (seen.metrics.get_sample_value("sqltasks_table_rows", labels) or 0) >= dead


@pytest.mark.skipif("connection.vendor == 'sqlite'", reason="SQLite has no vacuum horizon")
@pytest.mark.django_db
def test_an_old_transaction_warns_until_it_ends(operator: Client, settings: Any) -> None:
    settings.SQLTASKS_OLD_TRANSACTION_SECONDS = 0.5
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            if other.vendor == "postgresql":
                cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            else:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cursor.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            cursor.execute(f"SELECT count(*) FROM {TABLE}")  # takes the snapshot
            cursor.fetchone()
        time.sleep(1.0)
        seen = look(operator)
        seen.assert_warns("django_sqltasks.W005", "old_transaction")
        if seen.metrics is not None:
            age = seen.metrics.get_sample_value(
                "sqltasks_oldest_transaction_seconds", {"database": "default"}
            )
            assert age is not None and age >= 1.0
    finally:
        with other.cursor() as cursor:
            cursor.execute("ROLLBACK")
        other.close()
    # InnoDB refreshes information_schema.innodb_trx at most every 0.1 s.
    deadline = time.monotonic() + 5
    while old_transaction_seen() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "django_sqltasks.W005" not in look(operator).check_ids


@pytest.mark.parametrize("value", ["300", 0, -1, float("nan"), float("inf"), True, None])
def test_a_bad_old_transaction_setting_is_refused(settings: Any, value: Any) -> None:
    settings.SQLTASKS_OLD_TRANSACTION_SECONDS = value
    assert [m.id for m in checks.check_health_setting()] == ["django_sqltasks.E011"]
    assert health.old_transaction_seconds() == health.OLD_TRANSACTION_SECONDS


def test_the_old_transaction_setting_is_read(settings: Any) -> None:
    assert list(checks.check_health_setting()) == []
    settings.SQLTASKS_OLD_TRANSACTION_SECONDS = 60
    assert list(checks.check_health_setting()) == []
    assert health.old_transaction_seconds() == 60
