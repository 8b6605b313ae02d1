"""An operator overrides a queue's limits in the admin, in real headless Chromium: a bad value
is refused naming the rule, a good one shows in force with its source, and deleting it puts
the settings' limit back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from django_sqltasks.models import QueueLimitOverride
from tests.admin.browser.test_admin_browser import log_in
from tests.conftest import set_backend_options

pytestmark = pytest.mark.django_db(transaction=True)


def test_override_a_queue_limit_and_see_it_in_force(
    live_server: Any, page: Any, screenshot: Callable[[str], Path], settings: Any
) -> None:
    set_backend_options(settings, QUEUE_LIMITS={"other": {"concurrency": 5}})
    log_in(page, live_server)
    page.goto(f"{live_server.url}/admin/django_sqltasks/queuelimitoverride/")
    row = page.locator('#sqltasks-queue-limits tr[data-queue="other"]')
    assert row.locator(".sqltasks-concurrency").inner_text() == "5 (settings)"
    assert row.locator(".sqltasks-rate").inner_text() == "-"
    screenshot("queue-limits-01-settings")

    # Zero is refused, naming the field and the rule (a queue that runs nothing is paused).
    page.locator(".object-tools a.addlink").click()
    page.wait_for_selector("#id_queue_name")
    page.select_option("#id_backend_name", "default")
    page.fill("#id_queue_name", "other")
    page.fill("#id_concurrency_limit", "0")
    page.fill("#id_rate_limit", "10/m")
    page.click("input[name=_save]")
    error = page.locator("#id_concurrency_limit_error, .field-concurrency_limit .errorlist")
    assert "concurrency must be at least 1" in error.first.inner_text()
    assert "pause" in error.first.inner_text()
    screenshot("queue-limits-02-refused")
    assert not QueueLimitOverride.objects.exists()

    page.fill("#id_concurrency_limit", "2")
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist")
    row = page.locator('#sqltasks-queue-limits tr[data-queue="other"]')
    assert row.locator(".sqltasks-concurrency").inner_text() == "2 (override; settings: 5)"
    assert row.locator(".sqltasks-rate").inner_text() == "10/m (override; settings: none)"
    listed = page.locator("#result_list tbody tr")
    assert listed.count() == 1
    assert "2 (override; settings: 5)" in listed.first.inner_text()
    screenshot("queue-limits-03-overridden")

    # Delete the override: the settings' limit is in force again.
    listed.first.locator("th a").click()
    page.locator("a.deletelink").click()
    page.click("input[type=submit]")
    page.wait_for_selector(".messagelist")
    row = page.locator('#sqltasks-queue-limits tr[data-queue="other"]')
    assert row.locator(".sqltasks-concurrency").inner_text() == "5 (settings)"
    assert not QueueLimitOverride.objects.exists()
    screenshot("queue-limits-04-cleared")
