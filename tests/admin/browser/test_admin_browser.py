"""An operator's path through the admin in real headless Chromium, screenshotting each page."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskLimit, TaskRecord, WorkerRecord
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


def log_in(page: Any, live_server: Any) -> None:
    User.objects.create_superuser("operator", "op@example.com", "correct horse")
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "correct horse")
    page.click("input[type=submit]")
    page.wait_for_selector("#content-main")


FAILURES = [
    ("builtins.ValueError", "Traceback (most recent call last):\nValueError: no such order"),
    ("django_sqltasks.exceptions.TaskCancelled", "Cancelled in the admin by op."),
    ("django_sqltasks.exceptions.TaskTimeout", "Ran over its timeout of 5s. " + "x" * 200),
    ("django_sqltasks.exceptions.WorkerLost", "Its worker stopped heartbeating."),
]


def test_task_list_fits_1280_with_its_filters_and_tells_failures_apart(
    live_server: Any, page: Any, screenshot: Callable[[str], Path]
) -> None:
    for class_path, text in FAILURES:
        task_row(
            TaskResultStatus.FAILED,
            task_path="tests.tasks.a_task_with_a_rather_long_function_name",
            queue_name="notifications-high-priority",
            errors=[{"exception_class_path": class_path, "traceback": text}],
        )
    log_in(page, live_server)
    page.goto(f"{live_server.url}/admin/django_sqltasks/taskrecord/")
    screenshot("07-task-list-1280")
    # Nothing is cut off or scrolled sideways: the last column ends inside the window, left
    # of the filter sidebar.
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    last = page.locator("#result_list thead th").last.bounding_box()
    sidebar = page.locator("#changelist-filter").bounding_box()
    assert last["x"] + last["width"] <= sidebar["x"] + 1
    cells = page.locator("#result_list td.field-error_summary").all_inner_texts()
    assert sorted(cells) == sorted(
        [
            "ValueError: no such order",
            "TaskCancelled: Cancelled in the admin by op.",
            "WorkerLost: Its worker stopped heartbeating.",
            page.locator(".sqltasks-error-summary[title^='TaskTimeout']").inner_text(),
        ]
    )
    # Each row stays one line high, the long message cut with an ellipsis.
    heights = {
        round(box["height"])
        for box in map(lambda row: row.bounding_box(), page.locator("#result_list tbody tr").all())
    }
    assert len(heights) == 1, heights


def test_failed_task_page_opens_on_its_outcome_and_aligns_its_buttons(
    live_server: Any, page: Any, screenshot: Callable[[str], Path]
) -> None:
    failed = task_row(
        TaskResultStatus.FAILED,
        errors=[{"exception_class_path": FAILURES[0][0], "traceback": FAILURES[0][1]}],
    )
    log_in(page, live_server)
    page.goto(f"{live_server.url}/admin/django_sqltasks/taskrecord/{failed.pk}/change/")
    screenshot("08-failed-task-outcome-first")
    headings = page.locator("#content-main fieldset h2").all_inner_texts()
    assert headings[0].strip().lower() == "outcome", headings
    assert page.locator(".sqltasks-error-message").first.inner_text() == "no such order"
    retry = page.locator("#sqltasks-retry").bounding_box()
    history = page.locator(".object-tools a.historylink").bounding_box()
    assert abs(retry["y"] - history["y"]) <= 1, (retry, history)
    assert abs(retry["height"] - history["height"]) <= 1, (retry, history)
    crumbs = page.locator(".breadcrumbs").inner_text()
    assert "Task queue" in crumbs and "Tasks\u203a Tasks" not in crumbs.replace("\n", "\u203a ")


def test_queue_overview_breadcrumbs_look_like_every_other_page_s(
    live_server: Any, page: Any, screenshot: Callable[[str], Path]
) -> None:
    log_in(page, live_server)
    style = "e => [getComputedStyle(e).backgroundColor, getComputedStyle(e).paddingLeft]"
    page.goto(f"{live_server.url}/admin/django_sqltasks/taskrecord/")
    expected = page.locator(".breadcrumbs").evaluate(style)
    page.goto(f"{live_server.url}/admin/django_sqltasks/queueoverview/")
    screenshot("09-queue-overview-breadcrumbs")
    assert page.locator(".breadcrumbs").evaluate(style) == expected
    assert expected[0] not in ("rgba(0, 0, 0, 0)", "transparent")


@pytest.mark.parametrize("width", [1280, 1024])
def test_task_list_with_a_progress_row_fits_and_shows_every_column(
    live_server: Any, page: Any, screenshot: Callable[[str], Path], width: int
) -> None:
    for class_path, text in FAILURES:
        task_row(
            TaskResultStatus.FAILED,
            task_path="tests.tasks.a_task_with_a_rather_long_function_name",
            queue_name="notifications-high-priority",
            errors=[{"exception_class_path": class_path, "traceback": text}],
        )
    note = "resizing the product images of the spring catalogue, page 14 of 220"
    task_row(
        TaskResultStatus.RUNNING,
        task_path="tests.tasks.a_task_with_a_rather_long_function_name",
        owner="w1",
        worker_ids=["w1"],
        tags=["catalogue", "images"],
        progress={"attempt": 1, "progress": 0.42, "note": note, "metadata": {},
                  "updated_at": "2026-11-23T06:00:00+00:00"},
    )  # fmt: skip
    page.set_viewport_size({"width": width, "height": 800})
    log_in(page, live_server)
    page.goto(f"{live_server.url}/admin/django_sqltasks/taskrecord/")
    screenshot(f"07-task-list-progress-{width}")
    assert page.locator(".sqltasks-progress").count() == 1
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    # Every column is in sight, none behind the results' own sideways scroll.
    results = page.locator("#changelist .results").bounding_box()
    for header in page.locator("#result_list thead th").all():
        box = header.bounding_box()
        assert box["x"] + box["width"] <= results["x"] + results["width"] + 1, header.inner_text()


def test_limits_page_shows_its_waiting_column_at_1280(
    live_server: Any, page: Any, screenshot: Callable[[str], Path]
) -> None:
    key = "tests.tasks_limits.one_per_customer#customer_id:" + "7" * 120
    TaskLimit.objects.create(backend_name="default", key=key, concurrency=1, rate=10, period=60)
    task_row(TaskResultStatus.READY, task_path="tests.tasks_limits.one_per_customer", limit_key=key)
    log_in(page, live_server)
    page.goto(f"{live_server.url}/admin/django_sqltasks/tasklimit/")
    screenshot("10-limits-1280")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    waiting = page.locator("#result_list thead th.column-waiting").bounding_box()
    assert waiting["x"] + waiting["width"] <= 1280
    assert page.locator("#result_list td.field-waiting").inner_text() == "1"
