"""The queue overview's page with many queues: one page of them, the most due first, with how
many more there are, pages for them and a name filter. With 10,000 queues the whole list took a
minute and 10 MB to render, and every live update asked for it again."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_sqltasks.admin.overview import QUEUES_PER_PAGE
from django_sqltasks.core.backends import queues_on
from django_sqltasks.models import TaskRecord
from tests.factories import insert_rows

pytestmark = pytest.mark.django_db

URL = "admin:django_sqltasks_queueoverview_changelist"
QUEUES = 120


@pytest.fixture
def many_queues() -> None:
    """Queue ``qNNN`` holds NNN % 9 due tasks (at least one), waiting NNN seconds: q116, q107
    and q098 hold the most, and have waited the longest of those."""
    now = timezone.now()
    rows = [
        {"queue_name": f"q{q:03d}", "available_at": now - timedelta(seconds=q)}
        for q in range(QUEUES)
        for _ in range(q % 9 or 1)
    ]
    template = TaskRecord(task_path="tests.tasks.noop", backend_name="default")
    insert_rows(template, len(rows), lambda i: rows[i])


def listed() -> list[str]:
    """Every queue the overview lists: the fixture's, and the configured ones with no task."""
    names = {f"q{q:03d}" for q in range(QUEUES)}
    for configured in queues_on(TaskRecord.objects.db).values():
        names |= configured
    return sorted(names)


def shown(html: str) -> list[str]:
    return re.findall(r'<tr data-queue="([^"]+)">', html)


def test_a_page_shows_the_most_due_queues_and_says_how_many_more(
    admin_client: Client, many_queues: None
) -> None:
    html = admin_client.get(reverse(URL)).content.decode()
    first = shown(html)
    assert len(first) == QUEUES_PER_PAGE
    assert first[:3] == ["q116", "q107", "q098"]  # 8 due each; the longest waiting first
    total = len(listed())
    assert total <= 3 * QUEUES_PER_PAGE
    assert f"Queues 1 to {QUEUES_PER_PAGE} of {total}" in html
    assert f"And {total - QUEUES_PER_PAGE} more queues on the next pages." in html
    seen = list(first)
    for number in (2, 3):
        html = admin_client.get(reverse(URL), {"page": number}).content.decode()
        seen += shown(html)
    assert sorted(seen) == listed()  # each once, over 3 pages
    assert "more queues" not in html and 'rel="prev"' in html and 'rel="next"' not in html


def test_the_name_filter_finds_a_queue_beyond_the_first_page(
    admin_client: Client, many_queues: None
) -> None:
    html = admin_client.get(reverse(URL), {"q": "Q11"}).content.decode()
    assert shown(html) == [f"q{q}" for q in (116, 115, 114, 113, 112, 111, 119, 110, 118, 117)]
    assert f"whose name holds “Q11” (of {len(listed())})" in html
    html = admin_client.get(reverse(URL), {"q": "nosuch\x00", "page": "x"}).content.decode()
    assert shown(html) == [] and "No queue's name holds “nosuch”." in html
