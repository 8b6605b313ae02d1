"""Durable tasks in the admin: a task's steps, what a stopped task waits for, the filter of
waiting tasks, and sending its event or ending its wait."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import django
import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import EventRecord, StepRecord, TaskRecord
from django_sqltasks.worker import Worker
from tests import tasks_durable

pytestmark = pytest.mark.django_db(transaction=True)

RunWorker = Callable[..., Worker]


def assert_crumbs(html: str, here: str, task: Any = None) -> None:
    """The page has the admin's breadcrumb bar, as this Django styles it, ending at ``here``
    after the task list (and the task's page)."""
    tasks = reverse("admin:django_sqltasks_taskrecord_changelist")
    if django.VERSION >= (6, 1):
        crumbs = re.search(r'<ol class="breadcrumbs">(.*?)</ol>', html, re.S)
        assert crumbs, "no breadcrumb bar"
        assert crumbs.group(1).rstrip().endswith(f'<li aria-current="page">{here}</li>')
    else:
        crumbs = re.search(r'<div class="breadcrumbs">(.*?)</div>', html, re.S)
        assert crumbs, "no breadcrumb bar"
        assert crumbs.group(1).rstrip().endswith(f"&rsaquo; {here}")
    assert f'<a href="{tasks}">Tasks</a>' in crumbs.group(1)
    if task is not None:
        change = reverse("admin:django_sqltasks_taskrecord_change", args=[task])
        assert f'<a href="{change}">' in crumbs.group(1)


def page(client: Client, task_id: Any) -> str:
    response = client.get(reverse("admin:django_sqltasks_taskrecord_change", args=[task_id]))
    assert response.status_code == 200
    return response.content.decode()


def test_a_tasks_page_lists_its_steps_and_what_it_waits_for(
    admin_client: Client, run_worker: RunWorker, tmp_path: Path
) -> None:
    result = tasks_durable.waiter.enqueue(str(tmp_path / "log"), "order.paid", "42", 3600)
    run_worker()
    html = page(admin_client, result.id)
    assert 'class="sqltasks-steps"' in html
    assert "<code>before</code>" in html and "&quot;before&quot;" in html
    assert "Waiting for the event <code>order.paid</code> with the key <code>42</code>" in html
    assert 'id="sqltasks-send-event"' in html and 'id="sqltasks-end-wait"' in html


def test_a_sleeping_task_shows_until_when(
    admin_client: Client, run_worker: RunWorker, tmp_path: Path
) -> None:
    result = tasks_durable.sleeper.enqueue(str(tmp_path / "log"), 86400)
    run_worker()
    html = page(admin_client, result.id)
    assert "Sleeping until <time" in html
    assert 'id="sqltasks-send-event"' not in html and 'id="sqltasks-end-wait"' in html


def test_a_failed_step_shows_its_error(admin_client: Client, run_worker: RunWorker) -> None:
    result = tasks_durable.returns.enqueue("nan")
    run_worker()
    html = page(admin_client, result.id)
    assert 'data-state="failed"' in html
    assert "The result of step &#x27;bad&#x27; is nan" in html


def test_the_list_filters_waiting_tasks(
    admin_client: Client, run_worker: RunWorker, tmp_path: Path
) -> None:
    waiting = tasks_durable.waiter.enqueue(str(tmp_path / "log"), "order.paid", "1")
    sleeping = tasks_durable.sleeper.enqueue(str(tmp_path / "log"), 3600)
    plain = tasks_durable.plain.enqueue(1)
    run_worker()
    url = reverse("admin:django_sqltasks_taskrecord_changelist")
    for value, shown, hidden in [
        ("any", [waiting, sleeping], [plain]),
        ("event", [waiting], [sleeping, plain]),
        ("sleep", [sleeping], [waiting, plain]),
    ]:
        html = admin_client.get(url, {"waiting": value}).content.decode()
        for result in shown:
            assert str(result.id) in html, value
        for result in hidden:
            assert str(result.id) not in html, value


def test_an_operator_sends_the_event_a_task_waits_for(
    admin_client: Client, run_worker: RunWorker, tmp_path: Path
) -> None:
    result = tasks_durable.waiter.enqueue(str(tmp_path / "log"), "order.paid", "8")
    run_worker()
    url = reverse("admin:django_sqltasks_taskrecord_send_event", args=[result.id])
    form = admin_client.get(url).content.decode()
    assert "<code>order.paid</code> with the key <code>8</code>" in form
    assert_crumbs(form, "Send the event", task=result.id)
    bad = admin_client.post(url, {"payload": "{not json"})
    assert bad.status_code == 200 and "Not JSON" in bad.content.decode()
    response = admin_client.post(url, {"payload": '{"paid": true}'}, follow=True)
    assert "Event sent: the task runs on." in response.content.decode()
    run_worker()
    row = TaskRecord.objects.get(pk=result.id)
    assert row.status == TaskResultStatus.SUCCESSFUL and row.return_value == {"paid": True}


@pytest.mark.parametrize("seconds", [None, 3600])
def test_an_operator_ends_a_wait_or_a_sleep(
    seconds: float | None, admin_client: Client, run_worker: RunWorker, tmp_path: Path
) -> None:
    result: Any
    if seconds is None:
        result = tasks_durable.waiter.enqueue(str(tmp_path / "log"), "order.paid", "4")
    else:
        result = tasks_durable.sleeper.enqueue(str(tmp_path / "log"), seconds)
    run_worker()
    url = reverse("admin:django_sqltasks_taskrecord_end_wait", args=[result.id])
    response = admin_client.post(url, follow=True)
    assert "Wait ended: the task runs on" in response.content.decode()
    run_worker()
    row = TaskRecord.objects.get(pk=result.id)
    assert row.status == TaskResultStatus.SUCCESSFUL
    assert row.return_value == ({"timed_out": "4"} if seconds is None else "slept")


def test_ending_a_wait_needs_the_run_permission(
    client: Client, django_user_model: Any, run_worker: RunWorker, tmp_path: Path
) -> None:
    result = tasks_durable.sleeper.enqueue(str(tmp_path / "log"), 3600)
    run_worker()
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    client.force_login(user)
    url = reverse("admin:django_sqltasks_taskrecord_end_wait", args=[result.id])
    assert client.post(url).status_code == 403
    assert TaskRecord.objects.get(pk=result.id).status == TaskResultStatus.READY


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("NaN", "The event payload is nan, which JSON cannot represent."),
        ('{"amount": 1e300}', "The event payload[&#x27;amount&#x27;] is 1e+300, a float of"),
        ('"a\\u0000b"', "The event payload contains a NUL character"),
        ('"\\ud800"', "The event payload contains a lone surrogate"),
    ],
)
def test_an_operators_payload_the_rules_refuse_is_reported_and_sends_nothing(
    payload: str, message: str, admin_client: Client, run_worker: RunWorker, tmp_path: Path
) -> None:
    result = tasks_durable.waiter.enqueue(str(tmp_path / "log"), "order.paid", "6")
    run_worker()
    url = reverse("admin:django_sqltasks_taskrecord_send_event", args=[result.id])
    response = admin_client.post(url, {"payload": payload}, follow=True)
    assert message in response.content.decode()
    assert not EventRecord.objects.filter(sent_at__isnull=False).exists()
    run_worker()
    assert TaskRecord.objects.get(pk=result.id).status == TaskResultStatus.READY


def test_a_resumed_task_shows_the_attempts_its_result_and_context_count(
    admin_client: Client, run_worker: RunWorker, tmp_path: Path
) -> None:
    result = tasks_durable.sleeper.enqueue(str(tmp_path / "log"), 3600)
    run_worker()  # runs to its sleep
    past = timezone.now() - timedelta(seconds=1)
    StepRecord.objects.filter(task_id=result.id, state="waiting").update(wake_at=past)
    TaskRecord.objects.filter(pk=result.id).update(available_at=past)
    run_worker()  # resumes it, to its end
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 2
    assert TaskRecord.objects.get(pk=result.id).attempts == 1  # one charged to max_attempts
    html = page(admin_client, result.id)
    assert re.search(r'<div class="readonly">2 <span class="help"[^>]*>\(1 against', html)
    listed = admin_client.get(reverse("admin:django_sqltasks_taskrecord_changelist")).text
    assert re.search(r'<td class="field-attempts_display">2 <span', listed)
