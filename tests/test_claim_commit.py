"""OPTIONS CLAIM_SYNCHRONOUS_COMMIT: False turns PostgreSQL's synchronous_commit off for the
claim's own transaction, and for nothing else (enqueues, outcomes and requeues stay durable)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.core import checks
from django.db import connection, transaction

from django_sqltasks.compat import TaskResultStatus, task_backends
from django_sqltasks.core.options import BackendOptions, OptionError
from django_sqltasks.models import TaskRecord
from django_sqltasks.sql import dialect_for
from django_sqltasks.worker import Worker
from tests import tasks
from tests.conftest import set_backend_options

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="runs in the PostgreSQL leg of the suite"
)


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
def test_by_default_the_claim_leaves_synchronous_commit_alone() -> None:
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
        document, setting = cursor.fetchone()
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
