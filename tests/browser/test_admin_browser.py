"""An operator's path through the admin in real headless Chromium, screenshotting each page."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord, WorkerRecord
from tests.factories import task_row

pytestmark = pytest.mark.django_db(transaction=True)


def test_find_a_failed_task_retry_it_and_see_the_overview(
    live_server: Any, page: Any, screenshot: Callable[[str], Path]
) -> None:
    User.objects.create_superuser("operator", "op@example.com", "correct horse")
    failed = task_row(TaskResultStatus.FAILED, task_path="tests.tasks.fail", queue_name="other")
    for minutes in range(1, 6):
        task_row(TaskResultStatus.SUCCESSFUL, finished_ago=timedelta(minutes=minutes))
    task_row(TaskResultStatus.READY, task_path="tests.tasks.echo")
    WorkerRecord.objects.create(id="web-1-abc", backend_name="default", queue_names=["*"])

    # Log in through the form.
    page.goto(f"{live_server.url}/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "correct horse")
    page.click("input[type=submit]")
    page.wait_for_selector("#content-main")
    assert page.locator("a", has_text="Queue overview").count() >= 1
    screenshot("01-admin-index")

    # The task list, then filtered to failed tasks.
    page.goto(f"{live_server.url}/admin/django_sqltasks/taskrecord/")
    assert page.locator("#result_list tbody tr").count() == 7
    screenshot("02-task-list")
    page.locator("#changelist-filter a", has_text="Failed").first.click()
    page.wait_for_url("**status__exact=FAILED**")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    assert rows.first.locator('[data-status="FAILED"]').count() == 1
    screenshot("03-task-list-failed")

    # Open it: the error and its traceback are on the page.
    rows.first.locator("th a, td a").first.click()
    page.wait_for_selector(".sqltasks-error")
    assert "builtins.ValueError" in page.locator(".sqltasks-error").inner_text()
    assert "Traceback: boom" in page.content()
    screenshot("04-task-detail-failed")

    # Retry it from the detail page.
    page.click("#sqltasks-retry")
    page.wait_for_selector(".messagelist")
    assert "1 task(s) retried" in page.locator(".messagelist").inner_text()
    assert page.locator('[data-status="READY"]').count() == 1
    screenshot("05-task-retried")
    failed.refresh_from_db()
    assert failed.status == TaskResultStatus.READY
    assert TaskRecord.objects.filter(status=TaskResultStatus.FAILED).count() == 0

    # The overview: queues, the throughput chart, the worker.
    page.goto(f"{live_server.url}/admin/django_sqltasks/taskrecord/")
    page.locator(".object-tools a", has_text="Queue overview").click()
    page.wait_for_selector("#sqltasks-queues")
    assert page.locator('#sqltasks-queues tr[data-queue="default"]').count() == 1
    assert page.locator('#sqltasks-queues tr[data-queue="other"]').count() == 1
    assert page.locator("#sqltasks-throughput rect.ok").count() == 30
    assert page.locator("#sqltasks-throughput").is_visible()
    assert "web-1-abc" in page.locator("#sqltasks-workers").inner_text()
    screenshot("06-queue-overview")
