"""Prometheus metrics, when ``prometheus-client`` is installed (the ``metrics`` extra).

Counters and histograms follow the Django Tasks signals sent in the process that serves them:
in a worker, every task it starts and finishes. Queue depth, backlog age and live workers are
gauges read from the database, so any one process can report every queue; a reading serves
every scrape for REFRESH_INTERVAL seconds, so scrapes (or a flood of requests to the port) never
cost more than one overview query per interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from importlib.util import find_spec
from typing import Any

from django.db import connections

from ..compat import TaskResultStatus, task_enqueued, task_finished, task_started
from ..core.progress import live_writers
from . import overview
from .claims import of_backend
from .health import CODES, QUERY_SHOWN, horizon_holder

logger = logging.getLogger("django_sqltasks")

# Seconds: from a few milliseconds (a warm worker) to an hour (a backlog).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
LABELS = ("backend", "queue", "task")
REFRESH_INTERVAL = 5.0  # seconds one reading of the queues serves scrapes for
DEFAULT_ADDR = "127.0.0.1"  # metrics name queues and tasks: not on other interfaces unless asked
# The claims' gauges, per backend: the name after sqltasks_, its help, the ClaimCost field.
CLAIM_GAUGES = (
    ("claims_last_minute", "Main claims run by those workers in the last minute.", "count"),
    ("claim_rows_last_minute", "Tasks those claims returned.", "rows"),
    ("claim_mean_seconds", "Their mean duration (the statement, timed by the worker).", "mean"),
    (
        "claim_p99_seconds",
        "The highest of the workers' 99th percentiles (at least the backend's; each at most "
        "19% above the worker's own).",
        "p99",
    ),
    ("claim_max_seconds", "The longest of those claims.", "max"),
    (
        "claim_full_passes_last_minute",
        "PostgreSQL: claims that read every priority from its start, walking what a held "
        "snapshot keeps.",
        "full_passes",
    ),
    (
        "claim_full_pass_max_seconds",
        "PostgreSQL: the longest of those full passes.",
        "full_pass_max",
    ),
)


def available() -> bool:
    """Say whether prometheus-client is installed."""
    return find_spec("prometheus_client") is not None


class Metrics:
    """The metrics of one process, in their own registry; ``connect`` starts counting."""

    def __init__(
        self, using: str, registry: Any = None, refresh_interval: float = REFRESH_INTERVAL
    ) -> None:
        # Optional dependency (the metrics extra).
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.using = using
        self.registry = registry if registry is not None else CollectorRegistry()

        def counter(name: str, doc: str) -> Any:
            return Counter(f"sqltasks_tasks_{name}", doc, LABELS, registry=self.registry)

        self.enqueued = counter("enqueued", "Tasks enqueued by this process.")
        self.started = counter("started", "Task attempts started.")
        self.succeeded = counter("succeeded", "Tasks finished successfully.")
        self.failed = counter("failed", "Tasks that raised.")
        self.retried = counter("retried", "Attempts after the first: rescues and retries.")
        self.latency = Histogram(
            "sqltasks_task_latency_seconds",
            "Time from a task becoming due to its attempt starting.",
            LABELS,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.duration = Histogram(
            "sqltasks_task_duration_seconds",
            "Time from an attempt's start to its finish.",
            LABELS,
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(QueueCollector(using, refresh_interval))
        self.registry.register(ProgressCollector())

    def connect(self) -> None:
        """Count from the Django Tasks signals of this process."""
        # Strong references: a worker keeps no handle on its Metrics, so weak ones would vanish.
        uid = f"sqltasks-metrics-{id(self)}"
        task_enqueued.connect(self._on_enqueued, weak=False, dispatch_uid=uid)
        task_started.connect(self._on_started, weak=False, dispatch_uid=uid)
        task_finished.connect(self._on_finished, weak=False, dispatch_uid=uid)

    def disconnect(self) -> None:
        uid = f"sqltasks-metrics-{id(self)}"
        for signal in (task_enqueued, task_started, task_finished):
            signal.disconnect(dispatch_uid=uid)

    def _labels(self, result: Any) -> tuple[str, str, str]:
        return (result.backend, result.task.queue_name, result.task.module_path)

    def _on_enqueued(self, sender: Any, task_result: Any, **kwargs: Any) -> None:
        self.enqueued.labels(*self._labels(task_result)).inc()

    def _on_started(self, sender: Any, task_result: Any, **kwargs: Any) -> None:
        labels = self._labels(task_result)
        self.started.labels(*labels).inc()
        if task_result.attempts > 1:
            self.retried.labels(*labels).inc()
        due = task_result.task.run_after or task_result.enqueued_at
        if task_result.last_attempted_at and due and task_result.attempts == 1:
            seconds = (task_result.last_attempted_at - due).total_seconds()
            self.latency.labels(*labels).observe(max(seconds, 0.0))

    def _on_finished(self, sender: Any, task_result: Any, **kwargs: Any) -> None:
        labels = self._labels(task_result)
        if task_result.status == TaskResultStatus.SUCCESSFUL:
            self.succeeded.labels(*labels).inc()
        elif task_result.status == TaskResultStatus.FAILED:
            self.failed.labels(*labels).inc()
        if task_result.finished_at and task_result.last_attempted_at:
            seconds = (task_result.finished_at - task_result.last_attempted_at).total_seconds()
            self.duration.labels(*labels).observe(max(seconds, 0.0))


class QueueCollector:
    """Read queue depth, backlog age and live workers from the database, at most once per
    ``refresh_interval`` seconds whatever the number of scrapes."""

    def __init__(
        self,
        using: str,
        refresh_interval: float = REFRESH_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.using = using
        self.refresh_interval = refresh_interval
        self.clock = clock
        # Guarded by _lock: scrapes arrive on the HTTP server's threads, one per request.
        self._lock = threading.Lock()
        self._snapshot: Any = None
        self._read_at: float | None = None

    def snapshot(self) -> Any:
        """The latest reading, taken again if it is older than ``refresh_interval`` (None if
        the database could not be read)."""
        with self._lock:
            now = self.clock()
            if self._read_at is not None and now - self._read_at < self.refresh_interval:
                return self._snapshot
            # Set before reading: a failing database is not asked again on every scrape.
            self._read_at = now
            self._snapshot = self._read()
            return self._snapshot

    def _read(self) -> Any:
        try:
            return overview.take(using=self.using, minutes=1)
        except Exception:
            logger.exception("Could not read queue metrics from database %s", self.using)
            return None
        finally:
            connection = connections[self.using]  # the scrape thread's own connection
            if not connection.in_atomic_block:
                connection.close()

    def describe(self) -> list[Any]:
        return []  # collected lazily: no query when the collector is registered

    def collect(self) -> Iterator[Any]:
        # Optional dependency (the metrics extra).
        from prometheus_client.core import GaugeMetricFamily

        depth = GaugeMetricFamily(
            "sqltasks_queue_depth",
            "Tasks in a queue, by state.",
            labels=["backend", "queue", "state"],
        )
        oldest = GaugeMetricFamily(
            "sqltasks_queue_oldest_due_seconds",
            "How long the oldest due task of a queue has waited.",
            labels=["backend", "queue"],
        )
        workers = GaugeMetricFamily(
            "sqltasks_workers", "Live workers, by backend.", labels=["backend"]
        )
        paused = GaugeMetricFamily(
            "sqltasks_queue_paused",
            "1 while a queue is paused (its READY tasks are not claimed), else 0.",
            labels=["backend", "queue"],
        )
        snapshot = self.snapshot()
        if snapshot is None:
            return
        for q in snapshot.queues:
            for state, value in (
                ("due", q.due),
                ("scheduled", q.scheduled),
                ("running", q.running),
                # Due, but waiting on a task's concurrency or rate limit (counted in "due").
                ("limited", q.limited),
            ):
                depth.add_metric([q.backend, q.queue, state], value)
            paused.add_metric([q.backend, q.queue], 1.0 if q.paused else 0.0)
            age = q.oldest_age(snapshot.now)
            oldest.add_metric([q.backend, q.queue], age.total_seconds() if age else 0.0)
        per_backend: dict[str, int] = {}
        for w in snapshot.workers:
            per_backend[w.backend] = per_backend.get(w.backend, 0) + 1
        for backend, count in sorted(per_backend.items()):
            workers.add_metric([backend], count)
        yield from (depth, oldest, workers, paused)
        yield from self._claims(snapshot, GaugeMetricFamily)
        yield from self._upkeep(snapshot, GaugeMetricFamily)

    def _claims(self, snapshot: Any, family: Any) -> Iterator[Any]:
        """Gauges of what the claims of each backend's workers cost over the last minute, as
        their heartbeats publish it: a series only where it is known (no worker reporting,
        or no claim in the window, leaves it out; never 0)."""
        costs: dict[str, list[Any]] = {}
        for w in snapshot.workers:
            costs.setdefault(w.backend, []).append(w.claims)
        reporting = family(
            "sqltasks_claim_reporting_workers",
            "Workers of a backend whose heartbeat published their claims' cost within "
            "LEASE_TIMEOUT (what the other sqltasks_claim gauges cover).",
            labels=["backend"],
        )
        gauges = [
            (family(f"sqltasks_{name}", doc, labels=["backend"]), field)
            for name, doc, field in CLAIM_GAUGES
        ]
        for backend, found in sorted(costs.items()):
            claims = of_backend(found)
            reporting.add_metric([backend], claims.reporting)
            if claims.cost is None:
                continue
            for gauge, field in gauges:
                value = getattr(claims.cost, field)
                if value is not None:
                    gauge.add_metric([backend], value)
        yield reporting
        yield from (gauge for gauge, _ in gauges)

    def _upkeep(self, snapshot: Any, family: Any) -> Iterator[Any]:
        """Gauges of the task table's upkeep: the warnings, and what the database reports."""

        def gauge(name: str, doc: str, values: dict[str, float], label: str = "") -> Any:
            metric = family(name, doc, labels=["database", *([label] if label else [])])
            for value_label, value in values.items():
                metric.add_metric([self.using, *([value_label] if label else [])], value)
            return metric

        active = {w.code for w in snapshot.warnings}
        yield gauge(
            "sqltasks_table_warning",
            "1 while the task table's upkeep calls for a warning (see the database checks).",
            {code: float(code in active) for code in CODES},
            label="warning",
        )
        health = snapshot.health
        if health.autovacuum is not None:
            yield gauge(
                "sqltasks_table_autovacuum_enabled",
                "Whether autovacuum may clean the task table.",
                {"": float(health.autovacuum)},
            )
        if health.dead_rows is not None and health.live_rows is not None:
            yield gauge(
                "sqltasks_table_rows",
                "The task table's rows by the statistics' estimate, live or dead.",
                {"live": health.live_rows, "dead": health.dead_rows},
                label="state",
            )
        if health.known:
            yield gauge(
                "sqltasks_oldest_transaction_seconds",
                "Age of the oldest transaction of another session (0: none open).",
                {"": health.oldest_transaction_seconds or 0.0},
            )
        if health.vacuumed_seconds_ago is not None:
            yield gauge(
                "sqltasks_table_vacuumed_seconds_ago",
                "Since the task table's live partition was last vacuumed (by autovacuum or "
                "by hand; since the server started if never).",
                {"": health.vacuumed_seconds_ago},
            )
        holder = horizon_holder(health)
        if holder is not None:
            # One series at a time: the holder of the moment, named by its labels.
            info = family(
                "sqltasks_horizon_holder",
                "How long (seconds) the oldest transaction, prepared transaction or replication "
                "slot has held back the cleanup of the task table's dead rows (0 for a slot, "
                "whose age is not known in time); its labels name it.",
                labels=["database", "kind", "pid", "state", "application_name", "query"],
            )
            session = holder.kind == "session"
            info.add_metric(
                [
                    self.using,
                    holder.kind,
                    "" if holder.pid is None else str(holder.pid),
                    (health.oldest_transaction_state or "") if session else "",
                    (health.oldest_transaction_application or "") if session else "",
                    (holder.query or "")[:QUERY_SHOWN],
                ],
                holder.seconds or 0.0,
            )
            yield info
            if holder.xids is not None:
                yield gauge(
                    "sqltasks_horizon_holder_xids",
                    "How many transactions ago the horizon's holder began (PostgreSQL).",
                    {"": holder.xids},
                )
        if health.history_length is not None:
            yield gauge(
                "sqltasks_innodb_history_length",
                "InnoDB undo records not yet purged.",
                {"": health.history_length},
            )


class ProgressCollector:
    """What this process's running tasks report (``context.set_progress``), read from the
    workers' memory at each scrape: no query."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        # Optional dependency (the metrics extra).
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        writes = CounterMetricFamily(
            "sqltasks_progress_writes",
            "Progress reports written to the task table, or not (the write failed).",
            labels=["result"],
        )
        reporting = GaugeMetricFamily(
            "sqltasks_tasks_reporting_progress",
            "Running attempts of this process that have reported progress.",
            labels=list(LABELS),
        )
        least = GaugeMetricFamily(
            "sqltasks_task_progress_min",
            "The least progress (0 to 1) among those attempts: the one furthest behind.",
            labels=list(LABELS),
        )
        written = failed = 0
        by_task: dict[tuple[str, str, str], list[float]] = {}
        for writer in live_writers.all():
            done, lost = writer.counts()
            written, failed = written + done, failed + lost
            for report in writer.running():
                values = by_task.setdefault(report.labels, [])
                progress = report.snapshot().progress
                if progress is not None:
                    values.append(progress)
        writes.add_metric(["written"], written)
        writes.add_metric(["failed"], failed)
        for labels, values in sorted(by_task.items()):
            reporting.add_metric(list(labels), len(values))
            if values:
                least.add_metric(list(labels), min(values))
        yield from (writes, reporting, least)


def serve(port: int, using: str, addr: str = DEFAULT_ADDR) -> tuple[Metrics, Any]:
    """Count this process's tasks and serve /metrics on ``addr:port``; return the server too."""
    if not available():
        raise RuntimeError(
            "Metrics need prometheus-client: pip install 'django-sqltasks[metrics]'."
        )
    # Optional dependency (the metrics extra).
    from prometheus_client import start_http_server

    metrics = Metrics(using)
    metrics.connect()
    server, _thread = start_http_server(port, addr=addr, registry=metrics.registry)
    logger.info(
        "Serving metrics on http://%s:%d/metrics",
        addr,
        server.server_port,
        extra={"action": "metrics_start", "port": server.server_port},
    )
    return metrics, server
