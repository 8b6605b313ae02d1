"""Where a progress report shows: the admin's list and detail pages, and the metrics."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from django_sqltasks.models import TaskRecord
from django_sqltasks.worker import Worker
from tests import tasks, tasks_progress
from tests.conftest import set_backend_options, worker_thread
from tests.events import EventLog, Gate


def report(attempt: int, progress: float | None, note: str, **metadata: Any) -> dict[str, Any]:
    return {
        "attempt": attempt,
        "progress": progress,
        "note": note,
        "metadata": metadata,
        "updated_at": "2026-11-23T06:00:00+00:00",
    }


@pytest.mark.django_db
def test_the_list_shows_a_running_task_s_progress_under_its_status(
    admin_client: Client,
) -> None:
    running = tasks.add.enqueue(1, 2)
    TaskRecord.objects.filter(pk=running.id).update(
        status="RUNNING", worker_ids=["w"], progress=report(1, 0.4, "resizing <b>")
    )
    stale = tasks.add.enqueue(3, 4)  # a report of an earlier attempt: not shown
    TaskRecord.objects.filter(pk=stale.id).update(
        status="RUNNING", worker_ids=["w", "v"], progress=report(1, 0.9, "old attempt")
    )
    body = admin_client.get(reverse("admin:django_sqltasks_taskrecord_changelist")).text
    assert 'class="sqltasks-progress"' in body
    assert "40% resizing &lt;b&gt;" in body  # escaped
    assert "width:40.0%" in body
    assert "old attempt" not in body


@pytest.mark.django_db
def test_the_detail_page_shows_the_report_and_its_metadata(admin_client: Client) -> None:
    result = tasks.add.enqueue(1, 2)
    TaskRecord.objects.filter(pk=result.id).update(
        status="FAILED", worker_ids=["w"], progress=report(1, 0.25, "pages", pages=12)
    )
    url = reverse("admin:django_sqltasks_taskrecord_change", args=[result.id])
    body = admin_client.get(url).text
    assert "<strong>25.0%</strong> pages" in body
    assert "attempt 1, reported" in body
    assert "&quot;pages&quot;: 12" in body
    empty = tasks.add.enqueue(5, 6)
    url = reverse("admin:django_sqltasks_taskrecord_change", args=[empty.id])
    assert admin_client.get(url).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_metrics_show_the_progress_of_running_tasks(
    settings: Any, events: EventLog, gate: Gate
) -> None:
    metrics = pytest.importorskip("django_sqltasks.ops.metrics")
    pytest.importorskip("prometheus_client")
    set_backend_options(settings, HEARTBEAT_INTERVAL=0.2, LEASE_TIMEOUT=5)
    recorder = metrics.Metrics("default")
    result = tasks_progress.report_then_wait.enqueue(gate.path)
    labels = {
        "backend": "default",
        "queue": "default",
        "task": "tests.tasks_progress.report_then_wait",
    }
    with worker_thread(Worker(queue_names=["*"], concurrency=2)):
        events.until(
            lambda: recorder.registry.get_sample_value("sqltasks_task_progress_min", labels),
            "the running task's progress in the metrics",
        )
        assert recorder.registry.get_sample_value("sqltasks_task_progress_min", labels) == 0.25
        assert recorder.registry.get_sample_value("sqltasks_tasks_reporting_progress", labels) == 1
        # The heartbeat writes it, and counts the write once it has returned (after the row
        # shows it to another connection: wait for both).
        events.until(lambda: TaskRecord.objects.get(pk=result.id).progress, "the report")
        events.until(
            lambda: recorder.registry.get_sample_value(
                "sqltasks_progress_writes_total", {"result": "written"}
            ),
            "the report's write counted",
        )
        gate.open()
        events.wait("task_finished", id=str(result.id), status="SUCCESSFUL")
    assert recorder.registry.get_sample_value("sqltasks_task_progress_min", labels) is None
