"""OpenTelemetry (OPTIONS["TRACING"]): a span for each enqueue and each run, the run's span a
child of the enqueue's through the traceparent stored with the task; nothing without TRACING."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from django.core import checks

from django_sqltasks.compat import task_backends
from django_sqltasks.core import tracing as otel
from django_sqltasks.models import TaskRecord
from django_sqltasks.testing import run_tasks
from django_sqltasks.worker import Worker
from tests import tasks, tasks_flow
from tests.conftest import set_backend_options

trace = pytest.importorskip("opentelemetry.trace")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def _provider() -> None:
    """One SDK provider for the process (OpenTelemetry takes the first it is given), with
    EXPORTER added once, however often the module's fixtures are set up."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, sdk_trace.TracerProvider):
        provider = sdk_trace.TracerProvider()
        trace.set_tracer_provider(provider)
    if not getattr(provider, "_sqltasks_exporter", False):
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        provider._sqltasks_exporter = True


@pytest.fixture
def spans(settings: Any) -> Iterator[Callable[[], Sequence[Any]]]:
    set_backend_options(settings, TRACING=True)
    EXPORTER.clear()
    yield EXPORTER.get_finished_spans
    EXPORTER.clear()


def by_name(spans: Sequence[Any], prefix: str) -> list[Any]:
    return [s for s in spans if s.name.startswith(prefix)]


@pytest.mark.django_db(transaction=True)
def test_the_run_s_span_is_a_child_of_the_enqueue_s(
    spans: Callable[[], Sequence[Any]], run_worker: Callable[..., Worker]
) -> None:
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("request") as request:
        result = tasks.add.enqueue(1, 2)
        async_result = tasks.async_add.enqueue(3, 4)
    run_worker()
    enqueues = by_name(spans(), "enqueue tests.tasks.")
    runs = {s.attributes["messaging.message.id"]: s for s in by_name(spans(), "run ")}
    assert len(enqueues) == 2
    trace_id = request.get_span_context().trace_id
    for enqueue, task_id in zip(enqueues, (result.id, async_result.id), strict=True):
        assert enqueue.kind == trace.SpanKind.PRODUCER
        assert enqueue.parent.span_id == request.get_span_context().span_id
        assert enqueue.attributes["messaging.message.id"] == task_id
        assert enqueue.attributes["messaging.destination.name"] == "default"
        run = runs[task_id]
        assert run.kind == trace.SpanKind.CONSUMER
        assert run.context.trace_id == trace_id  # the request's trace, carried by the row
        assert run.parent.span_id == enqueue.context.span_id
        assert run.attributes["django_sqltasks.attempt"] == 1
        assert run.status.status_code == trace.StatusCode.UNSET
    row = TaskRecord.objects.get(pk=result.id)
    version, trace_hex, span_hex, _flags = row.trace_parent.split("-")
    assert (version, trace_hex, span_hex) == (
        "00",
        f"{trace_id:032x}",
        f"{enqueues[0].context.span_id:016x}",
    )


@pytest.mark.django_db(transaction=True)
def test_a_failed_run_s_span_says_so_and_a_snooze_is_no_failure(
    spans: Callable[[], Sequence[Any]], run_worker: Callable[..., Worker]
) -> None:
    tasks.fail.enqueue()
    tasks_flow.snooze_an_hour.enqueue()
    run_worker()
    [failed] = by_name(spans(), "run tests.tasks.fail")
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    [snoozed] = by_name(spans(), "run tests.tasks_flow.snooze_an_hour")
    assert snoozed.status.status_code == trace.StatusCode.UNSET
    assert snoozed.attributes["django_sqltasks.snoozed_seconds"] == 3600


@pytest.mark.django_db
def test_enqueue_many_and_run_tasks(spans: Callable[[], Sequence[Any]]) -> None:
    backend = task_backends["default"]
    results = backend.enqueue_many(tasks.add, [((1, 2), {}), ((3, 4), {})])
    [batch] = by_name(spans(), "enqueue ")
    assert batch.attributes["messaging.batch.message_count"] == 2
    rows = TaskRecord.objects.filter(pk__in=[r.id for r in results])
    assert {r.trace_parent.split("-")[2] for r in rows} == {f"{batch.context.span_id:016x}"}
    run_tasks()
    runs = by_name(spans(), "run ")
    assert len(runs) == 2
    assert {r.parent.span_id for r in runs} == {batch.context.span_id}


@pytest.mark.django_db(transaction=True)
async def test_aenqueue_opens_a_span(spans: Callable[[], Sequence[Any]]) -> None:
    result = await tasks.add.aenqueue(1, 2)
    [span] = by_name(spans(), "enqueue ")
    row = await TaskRecord.objects.aget(pk=result.id)
    assert row.trace_parent.split("-")[2] == f"{span.context.span_id:016x}"


@pytest.mark.django_db
def test_without_tracing_nothing_is_wrapped_or_stored() -> None:
    EXPORTER.clear()
    backend = task_backends["default"]
    assert backend.tracing is None
    assert "enqueue" not in vars(backend)  # the class's own method, not a wrapper
    result = tasks.add.enqueue(1, 2)
    run_tasks()
    assert EXPORTER.get_finished_spans() == ()
    assert TaskRecord.objects.get(pk=result.id).trace_parent is None


def test_tracing_must_be_a_bool_and_needs_the_api(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_backend_options(settings, TRACING="yes")
    [error] = task_backends["default"].check()
    assert error.id == "django_sqltasks.E002"
    assert "['TRACING'] must be True or False, not 'yes'." in error.msg
    monkeypatch.setattr(otel, "available", lambda: False)
    set_backend_options(settings, TRACING=True)
    backend = task_backends["default"]
    assert backend.tracing is None
    errors = [m for m in backend.check() if m.level >= checks.ERROR]
    assert [e.id for e in errors] == ["django_sqltasks.E012"]
