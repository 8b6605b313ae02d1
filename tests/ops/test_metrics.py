"""Prometheus metrics: counters from a real worker's signals, gauges from the database."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.core.claim_cost import ClaimCost
from django_sqltasks.models import WorkerRecord
from django_sqltasks.ops import metrics
from django_sqltasks.worker import Worker
from tests import tasks
from tests.factories import task_row, worker_row

pytest.importorskip("prometheus_client", reason="metrics need prometheus-client (metrics extra)")


@pytest.fixture
def recorder() -> Iterator[metrics.Metrics]:
    recorder = metrics.Metrics("default")
    recorder.connect()
    yield recorder
    recorder.disconnect()


def value(recorder: metrics.Metrics, name: str, **labels: str) -> float:
    return recorder.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.django_db(transaction=True)
def test_counters_follow_a_real_worker(
    recorder: metrics.Metrics, run_worker: Callable[..., Worker]
) -> None:
    tasks.add.enqueue(1, 2)
    tasks.add.enqueue(3, 4)
    tasks.fail.enqueue()
    run_worker()
    add = {"backend": "default", "queue": "default", "task": "tests.tasks.add"}
    fail = {**add, "task": "tests.tasks.fail"}
    assert value(recorder, "sqltasks_tasks_enqueued_total", **add) == 2
    assert value(recorder, "sqltasks_tasks_started_total", **add) == 2
    assert value(recorder, "sqltasks_tasks_succeeded_total", **add) == 2
    assert value(recorder, "sqltasks_tasks_failed_total", **fail) == 1
    assert value(recorder, "sqltasks_tasks_retried_total", **add) == 0
    assert value(recorder, "sqltasks_task_latency_seconds_count", **add) == 2
    assert value(recorder, "sqltasks_task_duration_seconds_count", **fail) == 1


@pytest.mark.django_db
def test_gauges_read_the_queues(recorder: metrics.Metrics) -> None:
    task_row()
    task_row()
    task_row(TaskResultStatus.RUNNING, queue_name="other")
    WorkerRecord.objects.create(id="w1", backend_name="default", queue_names=["*"])
    depth = "sqltasks_queue_depth"
    assert value(recorder, depth, backend="default", queue="default", state="due") == 2
    assert value(recorder, depth, backend="default", queue="other", state="running") == 1
    assert value(recorder, "sqltasks_workers", backend="default") == 1
    oldest = "sqltasks_queue_oldest_due_seconds"
    assert value(recorder, oldest, backend="default", queue="default") >= 0


@pytest.mark.django_db
def test_serve_exposes_metrics_over_http() -> None:
    recorder, server = metrics.serve(0, using="default", addr="127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read().decode()
        assert "sqltasks_tasks_started_total" in body and "sqltasks_queue_depth" in body
    finally:
        recorder.disconnect()
        server.shutdown()
        server.server_close()


def scrape_status(host: str, port: int) -> int | str:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
            return int(response.status)
    except OSError as e:
        return type(e).__name__


@pytest.mark.django_db
def test_serve_binds_the_loopback_interface_by_default() -> None:
    """Metrics name queues and tasks: another interface gets no answer unless asked for."""
    recorder, server = metrics.serve(0, using="default")
    try:
        port = server.server_port
        assert server.server_address[0] == "127.0.0.1"
        assert scrape_status("127.0.0.1", port) == 200
        assert scrape_status("127.0.0.2", port) != 200  # another address of this host
    finally:
        recorder.disconnect()
        server.shutdown()
        server.server_close()
    recorder, server = metrics.serve(0, using="default", addr="0.0.0.0")
    try:
        assert scrape_status("127.0.0.2", server.server_port) == 200
    finally:
        recorder.disconnect()
        server.shutdown()
        server.server_close()


@pytest.mark.django_db
def test_scrapes_share_one_reading_of_the_queues_per_refresh_interval() -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from prometheus_client import CollectorRegistry

    now = [1000.0]
    registry = CollectorRegistry()
    registry.register(metrics.QueueCollector("default", refresh_interval=5, clock=lambda: now[0]))
    labels = {"backend": "default", "queue": "default", "state": "due"}

    def due() -> float | None:
        return registry.get_sample_value("sqltasks_queue_depth", labels)

    task_row()
    with CaptureQueriesContext(connection) as first:
        assert due() == 1
    assert len(first) > 0
    task_row()
    now[0] += 4.9
    with CaptureQueriesContext(connection) as within:
        assert [due() for _ in range(50)] == [1] * 50  # the reading of the first scrape
    assert len(within) == 0, "a scrape within the interval queried the database"
    now[0] += 0.2
    with CaptureQueriesContext(connection) as after:
        assert due() == 2
    assert len(after) == len(first)


def test_available_without_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str, *args: Any) -> None:
        return None

    monkeypatch.setattr(metrics, "find_spec", missing)
    assert not metrics.available()
    with pytest.raises(RuntimeError, match=r"django-sqltasks\[metrics\]"):
        metrics.serve(0, using="default")


@pytest.mark.worker_process
@pytest.mark.django_db(transaction=True)
def test_worker_serves_metrics_on_its_port(worker_process: Callable[..., Any]) -> None:
    import socket

    from tests.conftest import wait_for

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tasks.add.enqueue(1, 2)
    worker = worker_process("--queue", "*", "--metrics-port", str(port))
    url = f"http://127.0.0.1:{port}/metrics"

    def scrape() -> str | None:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                body = response.read().decode()
        except OSError:
            return None
        return body if "sqltasks_tasks_succeeded_total{" in body else None

    try:
        body = wait_for(scrape, timeout=30)
    except AssertionError:
        raise AssertionError(worker.output) from None
    assert 'task="tests.tasks.add"} 1.0' in body, worker.output
    worker.stop()


@pytest.mark.django_db
def test_the_claims_gauges_per_backend_and_nothing_where_unknown() -> None:
    from prometheus_client import generate_latest

    worker_row("w1", ClaimCost(count=30, rows=60, mean=0.001, p99=0.004, max=0.005))
    worker_row(
        "w2",
        ClaimCost(
            count=10, rows=5, mean=0.003, p99=0.006, max=0.008, full_passes=1, full_pass_max=0.008
        ),
    )
    worker_row("w3", ClaimCost(count=9, rows=9, mean=9.0), measured_ago=timedelta(minutes=5))
    worker_row("w4", backend_name="other")  # an earlier version's row: publishes nothing
    text = generate_latest(metrics.Metrics("default").registry).decode()
    lines = set(text.splitlines())
    assert 'sqltasks_claim_reporting_workers{backend="default"} 2.0' in lines
    assert 'sqltasks_claims_last_minute{backend="default"} 40.0' in lines
    assert 'sqltasks_claim_rows_last_minute{backend="default"} 65.0' in lines
    mean = [
        line for line in lines if line.startswith('sqltasks_claim_mean_seconds{backend="default"}')
    ]
    assert len(mean) == 1 and float(mean[0].split()[-1]) == pytest.approx(0.0015)
    assert 'sqltasks_claim_p99_seconds{backend="default"} 0.006' in lines
    assert 'sqltasks_claim_max_seconds{backend="default"} 0.008' in lines
    assert 'sqltasks_claim_full_passes_last_minute{backend="default"} 1.0' in lines
    assert 'sqltasks_claim_full_pass_max_seconds{backend="default"} 0.008' in lines
    # The other backend's worker reports nothing: its count is known (0), its claims are not.
    assert 'sqltasks_claim_reporting_workers{backend="other"} 0.0' in lines
    assert not [
        line
        for line in lines
        if 'backend="other"' in line and "sqltasks_claim" in line and "reporting" not in line
    ]
    assert "# HELP sqltasks_claim_mean_seconds" in text
