"""Making a periodic task in the admin, in real headless Chromium: a bad cron expression is a
form error on its field, a good one is saved and its next runs are shown."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from django_sqltasks.models import ScheduleRecord

pytestmark = pytest.mark.django_db(transaction=True)


def test_make_a_schedule_and_see_its_next_runs(
    live_server: Any, page: Any, screenshot: Callable[[str], Path]
) -> None:
    User.objects.create_superuser("operator", "op@example.com", "correct horse")
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "correct horse")
    page.click("input[type=submit]")
    page.wait_for_selector("#content-main")

    page.goto(f"{live_server.url}/admin/django_sqltasks/schedulerecord/add/")
    # The next runs are previewed as the timing is typed, before anything is saved.
    page.fill("#id_every", "3600")
    page.wait_for_selector(".field-preview .sqltasks-next-runs")
    assert page.locator(".field-preview time").count() == 5
    page.fill("#id_every", "0.5")
    page.wait_for_selector(".field-preview .errornote")
    assert "must be a number of seconds from 1" in page.locator(".field-preview").inner_text()
    page.fill("#id_every", "")
    screenshot("schedules-00-live-preview")
    page.fill("#id_name", "morning-digest")
    page.fill("#id_task_path", "tests.tasks.tick")
    page.fill("#id_kwargs", '{"label": "digest"}')
    page.fill("#id_cron", "0 8 * * 1-5 *nope")
    page.fill("#id_time_zone", "Europe/Paris")
    page.click("input[name=_continue]")
    page.wait_for_selector(".errorlist")
    assert "is not a valid cron expression" in page.locator(".field-cron").inner_text()
    assert not ScheduleRecord.objects.exists()
    screenshot("schedules-01-bad-cron")

    page.fill("#id_cron", "0 8 * * 1-5")  # 08:00 on weekdays, Paris time
    page.click("input[name=_continue]")
    # The saved schedule's page (the add page's live preview shows next runs too: waiting for
    # them alone could read that page before the save, as a CI run did).
    page.wait_for_url("**/schedulerecord/*/change/**")
    page.wait_for_selector(".sqltasks-next-runs")
    runs = page.locator(".sqltasks-next-runs time")
    assert runs.count() == 5
    moments = [datetime.fromisoformat(runs.nth(i).get_attribute("datetime")) for i in range(5)]
    assert moments == sorted(moments)
    assert all(m.weekday() < 5 for m in moments)
    assert "08:00:00 Europe/Paris" in runs.first.inner_text()
    screenshot("schedules-02-preview")

    row = ScheduleRecord.objects.get()
    assert (row.name, row.origin, row.kwargs) == ("morning-digest", "admin", {"label": "digest"})
    page.goto(f"{live_server.url}/admin/django_sqltasks/schedulerecord/")
    assert "0 8 * * 1-5 (Europe/Paris)" in page.locator("#result_list").inner_text()
    screenshot("schedules-03-list")
