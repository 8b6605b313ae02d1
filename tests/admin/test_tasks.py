"""The admin's first cut: list, filters, search and a read-only detail page."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord
from tests import tasks

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
