"""OpenTelemetry spans for enqueues and runs (``OPTIONS["TRACING"]``, the ``otel`` extra).

An enqueue opens a PRODUCER span, in whatever trace is current (the request's, say), and the
task's row keeps that span's W3C ``traceparent``. The worker opens the run's CONSUMER span as
its child, so a trace shows the request, its enqueue, and each attempt that ran the task.

Only the OpenTelemetry API is used: the project sets up the SDK and its exporters as it does for
any instrumented library, and without an SDK every span is a no-op. With TRACING off (the
default) nothing here is imported, and enqueues and runs do not check anything per task but
``backend.tracing is None``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from ..exceptions import Snooze

if TYPE_CHECKING:
    from ..compat import Task
    from ..sql import ClaimedRow

TRACER_NAME = "django_sqltasks"
SYSTEM = "django_sqltasks"  # messaging.system


def available() -> bool:
    """Say whether the OpenTelemetry API (``opentelemetry-api``) is installed."""
    return find_spec("opentelemetry") is not None and find_spec("opentelemetry.trace") is not None


class Tracing:
    """The spans of one backend: ``enqueue`` around a write, ``run`` around an attempt."""

    def __init__(self, backend_alias: str) -> None:
        # Optional dependency (the otel extra): imported only with OPTIONS["TRACING"] on.
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.backend_alias = backend_alias
        self._trace = trace
        self._tracer = trace.get_tracer(TRACER_NAME)
        self._propagator = TraceContextTextMapPropagator()

    @contextlib.contextmanager
    def enqueue(self, task: Task, count: int = 1) -> Iterator[Any]:
        """A span for enqueueing ``count`` calls of ``task``; current inside the block, so
        ``traceparent()`` names it. An exception is recorded on it and re-raised."""
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.destination.name": task.queue_name,
            "django_sqltasks.task": task.module_path,
            "django_sqltasks.backend": self.backend_alias,
        }
        if count != 1:
            attributes["messaging.batch.message_count"] = count
        with self._tracer.start_as_current_span(
            f"enqueue {task.module_path}",
            kind=self._trace.SpanKind.PRODUCER,
            attributes=attributes,
        ) as span:
            yield span

    def traceparent(self) -> str | None:
        """The W3C traceparent of the current span, to store with the task (None if no span
        is recording, as without an SDK)."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        return carrier.get("traceparent")

    @staticmethod
    def enqueued(span: Any, result_ids: list[str]) -> None:
        """Name the enqueued task on the span (the first, for a batch)."""
        if result_ids:
            span.set_attribute("messaging.message.id", result_ids[0])

    @contextlib.contextmanager
    def run(self, row: ClaimedRow) -> Iterator[Any]:
        """A span for one attempt at ``row``, a child of its enqueue's span when the row
        carries one. An exception fails the span, but for ``Snooze``, which is no failure."""
        parent = None
        if row.trace_parent:
            parent = self._propagator.extract({"traceparent": row.trace_parent})
        with self._tracer.start_as_current_span(
            f"run {row.task_path}",
            context=parent,
            kind=self._trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.destination.name": row.queue_name,
                "messaging.message.id": str(row.id),
                "django_sqltasks.task": row.task_path,
                "django_sqltasks.backend": row.backend_name,
                "django_sqltasks.attempt": len(row.worker_ids),
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except Snooze as e:
                span.set_attribute("django_sqltasks.snoozed_seconds", e.seconds)
                raise
            except BaseException as e:
                span.record_exception(e)
                status = self._trace.Status(self._trace.StatusCode.ERROR, type(e).__qualname__)
                span.set_status(status)
                raise


def tracing_for(backend_alias: str, enabled: bool) -> Tracing | None:
    """The backend's ``Tracing`` if TRACING is on and the API is installed; None otherwise
    (the missing package is reported by check E012)."""
    if not enabled or not available():
        return None
    return Tracing(backend_alias)
