"""The admin's workers: the worker list and the queue overview's Workers section show what
each worker's claims cost over the last minute, and "unknown" where no fresh figure says."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.urls import reverse

from django_sqltasks.core.claim_cost import ClaimCost
from tests.factories import superuser_client, worker_row

pytestmark = pytest.mark.django_db

SLOW = ClaimCost(
    count=50, rows=100, mean=0.012, p99=0.03, max=0.04, full_passes=2, full_pass_max=0.04
)
LINE = "50 in the last minute, mean 12 ms, p99 30 ms, max 40 ms, 2.0 tasks a claim"


@pytest.fixture
def workers() -> None:
    worker_row("slow-1", SLOW)
    worker_row("busy-1", ClaimCost(count=0, rows=0))
    worker_row("stale-1", SLOW, measured_ago=timedelta(minutes=3))
    worker_row("old-1")  # a row of an earlier version: its heartbeat publishes nothing


def cells(body: str, worker_id: str) -> str:
    """The text of the table row that names ``worker_id``."""
    (row,) = [r for r in re.findall(r"<tr.*?</tr>", body, re.S) if f">{worker_id}<" in r]
    return html.unescape(re.sub(r"<[^>]+>", " ", row))


def test_the_worker_list_shows_each_worker_s_claims(workers: None) -> None:
    client = superuser_client()
    response = client.get(reverse("admin:django_sqltasks_workerrecord_changelist"))
    assert response.status_code == 200
    body = response.content.decode()
    assert "claims (last minute)" in body.lower()
    assert LINE in cells(body, "slow-1") and "2 full pass(es), the slowest 40 ms" in body
    assert "no claim in the last minute (duration unknown)" in cells(body, "busy-1")
    for unknown in ("stale-1", "old-1"):
        assert "unknown (no fresh figure)" in cells(body, unknown), unknown
    detail = client.get(reverse("admin:django_sqltasks_workerrecord_change", args=["slow-1"]))
    assert LINE in html.unescape(detail.content.decode())


def test_the_overview_shows_the_claims_of_each_worker_and_backend(workers: None) -> None:
    response = superuser_client().get(reverse("admin:django_sqltasks_queueoverview_changelist"))
    assert response.status_code == 200
    body = html.unescape(response.content.decode())
    (summary,) = re.findall(r'<ul id="sqltasks-claims">(.*?)</ul>', body, re.S)
    # The backend's: the two fresh figures of four workers (none duration of the idle one).
    assert "Claims of backend default: " + LINE in summary
    assert "(2 of 4 workers reporting)" in summary
    table = body.split('id="sqltasks-workers"')[1]
    assert LINE in cells(table, "slow-1")
    assert "no claim in the last minute (duration unknown)" in cells(table, "busy-1")
    assert "unknown (no fresh figure)" in cells(table, "stale-1")
    assert "unknown (no fresh figure)" in cells(table, "old-1")
