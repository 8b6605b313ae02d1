"""``manage.py tasks_status`` and the overview snapshot behind it and the admin page."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import WorkerRecord
from django_sqltasks.ops import overview
from tests.factories import task_row

pytestmark = pytest.mark.django_db


@pytest.fixture
def queues() -> None:
    now = timezone.now()
    task_row(available_at=now - timedelta(minutes=5))
    task_row(available_at=now - timedelta(seconds=5))
    task_row(available_at=now + timedelta(hours=1))  # scheduled
    task_row(TaskResultStatus.RUNNING, queue_name="other", owner="w1")
    task_row(TaskResultStatus.SUCCESSFUL, queue_name="other", finished_ago=timedelta(minutes=2))
    task_row(TaskResultStatus.FAILED, queue_name="other", finished_ago=timedelta(minutes=3))
    task_row(TaskResultStatus.FAILED, queue_name="other", finished_ago=timedelta(days=3))
    task_row(queue_name="orphan")
    WorkerRecord.objects.create(
        id="w1", backend_name="default", queue_names=["default", "other"], concurrency=4
    )


def test_snapshot(queues: None) -> None:
    snap = overview.take()
    by_queue = {q.queue: q for q in snap.queues}
    default, other, orphan = by_queue["default"], by_queue["other"], by_queue["orphan"]
    assert (default.due, default.scheduled, default.running) == (2, 1, 0)
    assert timedelta(minutes=4) < default.oldest_age(snap.now) < timedelta(minutes=6)
    assert (other.running, other.succeeded, other.failed) == (1, 1, 1)  # 3-day-old one is out
    assert default.served and other.served and not orphan.served
    assert [(w.id, w.running) for w in snap.workers] == [("w1", 1)]
    assert len(snap.throughput) == overview.THROUGHPUT_MINUTES
    assert sum(ok for _, ok, _ in snap.throughput) == 1
    assert sum(bad for _, _, bad in snap.throughput) == 1


def test_status_command_plain(queues: None) -> None:
    out = StringIO()
    call_command("tasks_status", "--plain", stdout=out)
    text = out.getvalue()
    assert "Queues" in text and "Workers" in text
    lines = {line.split()[1]: line.split() for line in text.splitlines() if "default " in line}
    assert lines["orphan"][-3:] == ["NO", "no", "0"]  # served, paused, limited
    assert lines["default"][2:5] == ["2", "1", "0"]
    assert "w1" in text


def test_status_command_unknown_backend() -> None:
    with pytest.raises(CommandError, match="not a django_sqltasks backend"):
        call_command("tasks_status", "--backend", "immediate")


def test_overview_page(queues: None) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    index = client.get(reverse("admin:index")).content.decode()
    url = reverse("admin:django_sqltasks_queueoverview_changelist")
    assert url in index  # listed in the admin index
    body = client.get(url).content.decode()
    assert 'data-queue="orphan"' in body and 'id="sqltasks-throughput"' in body
    assert "w1" in body and 'class="warn"' in body


def test_overview_needs_view_permission() -> None:
    client = Client()
    client.force_login(User.objects.create_user("s", "s@example.com", "pw", is_staff=True))
    url = reverse("admin:django_sqltasks_queueoverview_changelist")
    assert client.get(url).status_code == 403


def test_status_command_piped_is_never_cut_to_a_width() -> None:
    # Output that is not a terminal (a pipe, a file, this StringIO) gets whole values.
    long_id = "worker-on-a-host-with-a-long-name.example.internal-0123456789ab"
    WorkerRecord.objects.create(
        id=long_id, backend_name="default", queue_names=["default", "other", "slow"]
    )
    task_row(queue_name="slow")
    out = StringIO()
    call_command("tasks_status", stdout=out)
    text = out.getvalue()
    assert long_id in text and "default,other,slow" in text
    assert "…" not in text and "─" not in text  # no rich ellipsis, no box drawing


def test_a_configured_queue_with_no_task_is_listed_not_served(queues: None) -> None:
    """QUEUES lists "slow", which has no task and no worker: tasks_health says it is not
    served, and so do tasks_status and the overview, rather than leaving it out."""
    out = StringIO()
    call_command("tasks_status", "--plain", stdout=out)
    lines = {
        line.split()[1]: line.split() for line in out.getvalue().splitlines() if "default " in line
    }
    assert lines["slow"][2:5] == ["0", "0", "0"] and lines["slow"][-3:] == ["NO", "no", "0"]
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    body = client.get(reverse("admin:django_sqltasks_queueoverview_changelist")).content.decode()
    assert 'data-queue="slow"' in body


def test_the_overview_writes_every_time_on_a_24_hour_clock(queues: None) -> None:
    """As the lists do: "As of 2026-12-02 14:05:09", the workers' times the same, and the live
    line's "updated 14:05:09" (not the browser's locale, which may be a 12-hour clock)."""
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    body = client.get(reverse("admin:django_sqltasks_queueoverview_changelist")).content.decode()
    heartbeat = timezone.localtime(WorkerRecord.objects.get(id="w1").heartbeat_at)
    assert f"<td>{heartbeat:%Y-%m-%d %H:%M:%S} (" in body
    assert "a.m." not in body and "p.m." not in body
    assert "toLocaleTimeString" not in body
