"""The overview, the task list and a running task's page update without a reload, in real
headless Chromium: a row's status, a task's page and the overview's counts change in place,
while a ticked checkbox stays ticked and the admin's selection counter keeps working."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord
from tests.admin.browser.test_admin_browser import log_in
from tests.factories import task_row

pytestmark = pytest.mark.django_db(transaction=True)

UPDATED = (
    "() => new Promise(done => document.addEventListener('sqltasks:updated', done, {once: true}))"
)


def finish(task: TaskRecord) -> None:
    TaskRecord.objects.filter(pk=task.pk).update(
        status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now(), return_value=3
    )


def test_list_task_page_and_overview_update_in_place(live_server: Any, page: Any) -> None:
    running = task_row(TaskResultStatus.RUNNING)
    other = task_row(TaskResultStatus.READY)
    log_in(page, live_server)

    page.goto(f"{live_server.url}/admin/django_sqltasks/taskrecord/")
    page.evaluate("window.notReloaded = true")
    page.locator(f'input.action-select[value="{other.pk}"]').check()
    finish(running)
    new = task_row(TaskResultStatus.READY)
    page.evaluate(UPDATED)
    row = page.locator(f'tr:has(input.action-select[value="{running.pk}"])')
    assert row.locator(".sqltasks-status").get_attribute("data-status") == "SUCCESSFUL"
    assert page.evaluate("window.notReloaded") is True
    assert page.locator(f'input.action-select[value="{other.pk}"]').is_checked()
    assert "1 newer task(s)" in page.locator("#sqltasks-live-new").inner_text()
    above = "document.getElementById('sqltasks-live-new').getBoundingClientRect().top"
    table = "document.getElementById('result_list').getBoundingClientRect().top"
    assert page.evaluate(f"{above} < {table}")  # announced above the rows, not under 50 of them
    page.locator(f'input.action-select[value="{running.pk}"]').check()
    assert "2 of 2 selected" in page.locator(".action-counter").inner_text()

    page.goto(f"{live_server.url}/admin/django_sqltasks/taskrecord/{new.pk}/change/")
    page.evaluate("window.notReloaded = true")
    TaskRecord.objects.filter(pk=new.pk).update(
        status=TaskResultStatus.RUNNING, attempts=1, started_at=timezone.now(), owner="w1"
    )
    page.evaluate(UPDATED)
    assert page.locator(".sqltasks-status").first.get_attribute("data-status") == "RUNNING"
    assert page.evaluate("window.notReloaded") is True

    page.goto(f"{live_server.url}/admin/django_sqltasks/queueoverview/")
    page.evaluate("window.notReloaded = true")
    before = page.locator("[data-sqltasks-live]").inner_text()
    task_row(TaskResultStatus.READY, queue_name="slow")
    page.evaluate(UPDATED)
    after = page.locator("[data-sqltasks-live]").inner_text()
    assert after != before and "slow" in after
    assert page.evaluate("window.notReloaded") is True


# The page's timers and fetches, held by the test: a timer runs only when the test fires it,
# and a fetch answers only when the test lets it. No clock is waited on.
HOLD_TIMERS_AND_FETCHES = """
window.heldTimers = [];
window.heldFetches = [];
window.fetchesAsked = 0;
window.setTimeout = function (fn) { window.heldTimers.push(fn); return window.heldTimers.length; };
window.heldIntervals = [];  // an interval stays: each firing runs it again
window.setInterval = function (fn) { window.heldIntervals.push(fn); return 0; };
var realFetch = window.fetch.bind(window);
window.fetch = function (url, options) {
  window.fetchesAsked += 1;
  return new Promise(function (resolve) {
    window.heldFetches.push(function () { realFetch(url, options).then(resolve); });
  });
};
window.fireTimers = function () {
  var due = window.heldTimers.splice(0).concat(window.heldIntervals);
  due.forEach(function (fn) { fn(); });
  return due.length;
};
"""


def test_the_live_update_asks_again_only_once_its_fetch_has_answered(
    live_server: Any, page: Any
) -> None:
    """It fetched every 5 s whether or not the last fetch had answered: a page slower than
    that to render (the overview of 10,000 queues took a minute) was asked for again and again,
    each render beside the others."""
    log_in(page, live_server)
    page.add_init_script(HOLD_TIMERS_AND_FETCHES)
    page.goto(f"{live_server.url}/admin/django_sqltasks/queueoverview/")
    assert page.evaluate("window.fireTimers()") == 1  # the first update's turn
    assert page.evaluate("window.fetchesAsked") == 1
    # Its fetch has not answered: however many turns pass, no second fetch is asked for.
    for _ in range(3):
        page.evaluate("window.fireTimers()")
    assert page.evaluate("window.fetchesAsked") == 1
    # Once it answers, the next update is due a turn later.
    page.evaluate(
        "() => new Promise(done => { document.addEventListener('sqltasks:updated', done, "
        "{once: true}); window.heldFetches.splice(0).forEach(go => go()); })"
    )
    page.wait_for_function("window.heldTimers.length === 1")
    page.evaluate("window.fireTimers()")
    assert page.evaluate("window.fetchesAsked") == 2
