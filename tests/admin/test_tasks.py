"""The admin's first cut: list, filters, search and a read-only detail page."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_sqltasks import chain
from django_sqltasks.compat import TaskResultStatus, task_backends
from django_sqltasks.core.workflow_plan import SKIPPED
from django_sqltasks.models import TaskRecord
from django_sqltasks.testing import run_tasks
from tests import tasks
from tests.factories import superuser_client, task_row

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client_() -> Client:
    user = User.objects.create_superuser("admin", "admin@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


def test_list_shows_tasks_with_status_badges(admin_client_: Client) -> None:
    tasks.add.enqueue(1, 2)
    failed = tasks.fail.enqueue()
    TaskRecord.objects.filter(id=failed.id).update(status=TaskResultStatus.FAILED)
    response = admin_client_.get(reverse("admin:django_sqltasks_taskrecord_changelist"))
    assert response.status_code == 200
    body = response.content.decode()
    assert 'data-status="READY"' in body
    assert 'data-status="FAILED"' in body
    assert ">add<" in body and ">fail<" in body


def test_filter_by_status_and_search_by_id(admin_client_: Client) -> None:
    ok = tasks.add.enqueue(1, 2)
    bad = tasks.fail.enqueue()
    TaskRecord.objects.filter(id=bad.id).update(status=TaskResultStatus.FAILED)
    url = reverse("admin:django_sqltasks_taskrecord_changelist")
    filtered = admin_client_.get(url, {"status__exact": "FAILED"}).content.decode()
    assert bad.id in filtered and ok.id not in filtered
    searched = admin_client_.get(url, {"q": ok.id}).content.decode()
    assert ok.id in searched and bad.id not in searched
    by_path = admin_client_.get(url, {"q": "tests.tasks.fail"}).content.decode()
    assert bad.id in by_path and ok.id not in by_path


def test_detail_shows_arguments_and_every_error(admin_client_: Client) -> None:
    result = tasks.echo.enqueue("hello", n=3)
    TaskRecord.objects.filter(id=result.id).update(
        status=TaskResultStatus.FAILED,
        errors=[
            {"exception_class_path": "builtins.ValueError", "traceback": "Traceback: first"},
            {"exception_class_path": "builtins.KeyError", "traceback": "Traceback: <second>"},
        ],
    )
    url = reverse("admin:django_sqltasks_taskrecord_change", args=[result.id])
    body = admin_client_.get(url).content.decode()
    assert "&quot;hello&quot;" in body
    assert "&quot;n&quot;: 3" in body
    assert "builtins.ValueError" in body and "builtins.KeyError" in body
    assert "Traceback: &lt;second&gt;" in body  # escaped, not rendered as HTML
    assert 'name="_save"' not in body  # read-only


def test_workers_list_renders(admin_client_: Client) -> None:
    response = admin_client_.get(reverse("admin:django_sqltasks_workerrecord_changelist"))
    assert response.status_code == 200


# Levels of a nested errors value; MariaDB's JSON stops at 32, and refuses the row beyond.
DEEP = 28 if connection.vendor == "mysql" else 200


def nested(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


MISSHAPEN_ERRORS = [
    pytest.param({"exception_class_path": "x", "traceback": "y"}, id="a dict, not a list"),
    pytest.param("boom", id="a string"),
    pytest.param([1, None, ["x"]], id="items that are not dicts"),
    pytest.param([{"exception_class_path": 3, "traceback": ["a", "b"]}], id="values not text"),
    pytest.param([{"other": "keys"}], id="no keys"),
    pytest.param(
        [{"exception_class_path": "builtins.ValueError", "traceback": nested(DEEP)}],
        id="deep value",
    ),
    pytest.param(nested(DEEP), id="deep"),
]


@pytest.mark.django_db
@pytest.mark.parametrize("errors", MISSHAPEN_ERRORS)
def test_misshapen_errors_show_in_the_admin_and_read_back(errors: Any) -> None:
    row = task_row(TaskResultStatus.FAILED, errors=errors)
    client = superuser_client()
    listed = client.get(reverse("admin:django_sqltasks_taskrecord_changelist"))
    assert listed.status_code == 200
    page = client.get(reverse("admin:django_sqltasks_taskrecord_change", args=[row.pk]))
    assert page.status_code == 200
    result = task_backends["default"].get_result(str(row.pk))
    assert result.errors, "a FAILED row's errors, however stored, read back as at least one"
    for error in result.errors:
        assert isinstance(error.exception_class_path, str)
        assert isinstance(error.traceback, str)


def failed_chain() -> tuple[str, str]:
    """A chain whose first step failed: the ids of that step and of the one that never ran."""
    workflow = chain(tasks.fail.s("first"), tasks.add.s(1)).enqueue()
    first, second = workflow.task_ids
    run_tasks()
    assert TaskRecord.objects.get(pk=second).status == TaskResultStatus.FAILED
    return first, second


@pytest.mark.django_db
def test_a_workflow_step_that_never_ran_offers_no_retry_and_is_skipped_by_the_action() -> None:
    first, never_ran = failed_chain()
    client = superuser_client()
    page = client.get(reverse("admin:django_sqltasks_taskrecord_change", args=[never_ran]))
    assert b'id="sqltasks-retry"' not in page.content
    assert (
        b'id="sqltasks-retry"'
        in client.get(reverse("admin:django_sqltasks_taskrecord_change", args=[first])).content
    )
    response = client.post(
        reverse("admin:django_sqltasks_taskrecord_changelist"),
        {"action": "retry_tasks", "_selected_action": [never_ran]},
        follow=True,
    )
    text = response.content.decode()
    assert "0 task(s) retried" in text and "workflow steps that never ran" in text
    assert TaskRecord.objects.get(pk=never_ran).status == TaskResultStatus.FAILED


@pytest.mark.django_db
def test_a_workflow_step_page_shows_the_whole_error_and_no_far_future_time() -> None:
    _, never_ran = failed_chain()
    record = TaskRecord.objects.get(pk=never_ran)
    message = record.errors[-1]["traceback"]
    assert record.errors[-1]["exception_class_path"] == SKIPPED
    page = superuser_client().get(
        reverse("admin:django_sqltasks_taskrecord_change", args=[never_ran])
    )
    text = page.content.decode()
    assert message in text.replace("&#x27;", "'")
    assert "9999" not in text
    assert "white-space: pre-wrap" in text  # long lines wrap instead of running off


@pytest.mark.django_db
def test_times_show_their_seconds() -> None:
    enqueued = timezone.now().replace(microsecond=0) - timedelta(days=3)
    row = task_row(TaskResultStatus.SUCCESSFUL, enqueued_at=enqueued)
    client = superuser_client()
    page = client.get(reverse("admin:django_sqltasks_taskrecord_change", args=[row.pk]))
    shown = timezone.localtime(enqueued).strftime("%H:%M:%S")
    assert shown in page.content.decode()
    listed = client.get(reverse("admin:django_sqltasks_taskrecord_changelist")).content.decode()
    assert re.search(rf">[^<]*{shown}</time>", listed), "the list's time has its seconds"
