"""What keeps the admin's lists fast and safe: estimated counts, bounded filters, no NUL queries,
and pages that write without failing on a busy SQLite database."""

from __future__ import annotations

import contextlib
import json
from contextlib import AbstractContextManager
from functools import cached_property
from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connections, router
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.utils.translation import gettext_lazy as _

from ..core.settings import sql_backends
from ..models import TaskRecord, WorkerRecord
from ..sql import dialect_for

EXACT_COUNT_BELOW = 1000  # rows: results smaller than this are counted exactly
RECENT_TASKS_SCANNED = 2000  # newest tasks whose paths fill the task filter


class EstimatedCountPaginator(Paginator):
    """Where the planner's estimate is cheap (PostgreSQL), count large results from it
    instead of COUNT(*).

    An exact count reads every matching row. Here a bounded count reads at most
    ``EXACT_COUNT_BELOW`` of them; a result that large is then given the planner's estimate
    (``reltuples`` scaled by the table's current size and the filter's selectivity), which costs
    nothing. Other databases count exactly.
    """

    estimated = False

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if (
            isinstance(queryset, QuerySet)
            and dialect_for(connections[queryset.db]).estimates_counts
        ):
            bounded = queryset.order_by()[:EXACT_COUNT_BELOW].count()
            if bounded < EXACT_COUNT_BELOW:
                return bounded
            self.estimated = True
            return max(planner_estimate(queryset), bounded)
        return super().count


def planner_estimate(queryset: QuerySet[Any]) -> int:
    """Return PostgreSQL's estimate of how many rows ``queryset`` returns."""
    plan = json.loads(queryset.order_by().explain(format="json"))
    return int(plan[0]["Plan"]["Plan Rows"])


class QueueFilter(admin.SimpleListFilter):
    """Queues from the settings, from live workers, and from tasks waiting or running.

    Waiting and running tasks are read through their partial indexes; a full ``DISTINCT`` over
    the table would read every row.
    """

    title = _("queue")
    parameter_name = "queue_name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = {name for backend in sql_backends().values() for name in backend.queues}
        tasks = TaskRecord.objects.order_by()
        names.update(tasks.ready().values_list("queue_name", flat=True).distinct())
        names.update(tasks.running().values_list("queue_name", flat=True).distinct())
        for queues in WorkerRecord.objects.values_list("queue_names", flat=True):
            names.update(name for name in queues if name != "*")
        if self.value():
            names.add(str(self.value()))
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        return queryset.filter(queue_name=self.value()) if self.value() else queryset


class TaskFilter(admin.SimpleListFilter):
    """Task paths among the newest tasks: a bounded read of the primary key, newest first."""

    title = _("task")
    parameter_name = "task_path"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recent = TaskRecord.objects.order_by("-id").values_list("task_path", flat=True)
        paths = set(recent[:RECENT_TASKS_SCANNED])
        if self.value():
            paths.add(str(self.value()))
        return [(p, p.rsplit(".", 1)[-1] + f" ({p.rsplit('.', 1)[0]})") for p in sorted(paths)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        return queryset.filter(task_path=self.value()) if self.value() else queryset


class SQLBackendFilter(admin.SimpleListFilter):
    """The TASKS aliases of SQL backends; shown only when there are several."""

    title = _("backend")
    parameter_name = "backend_name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        aliases = sorted(sql_backends())
        return [(a, a) for a in aliases] if len(aliases) > 1 else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        return queryset.filter(backend_name=self.value()) if self.value() else queryset


def nul_parameter(request: HttpRequest) -> str | None:
    """The name of a query parameter whose value holds a NUL, if any.

    No text column can hold a NUL (PostgreSQL refuses it in any query), so a filter or search
    for one can match nothing; refused here, before the query fails.
    """
    for name, values in request.GET.lists():
        if "\x00" in name or any("\x00" in value for value in values):
            return name
    return None


class NulSafeAdmin:
    """Answer 400 to a list URL whose parameters hold a NUL, and 404 to such an object id."""

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        name = nul_parameter(request)
        if name is not None:
            return HttpResponseBadRequest(
                f"The parameter {name!r} holds a NUL character, which no task, queue or worker "
                "name can contain.",
                content_type="text/plain; charset=utf-8",
            )
        response: HttpResponse = super().changelist_view(  # type: ignore[misc]
            request, extra_context
        )
        return response

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        if "\x00" in object_id:
            return None
        return super().get_object(request, object_id, from_field)  # type: ignore[misc]


class WritesLocked:
    """Run a page's POSTs (a save, a deletion) in a transaction that takes the write
    lock at its start, where the database needs it (SQLite): Django's views read the row, then
    write, and on SQLite such a transaction fails at once ("database is locked") if a worker
    wrote in between, instead of waiting for the busy timeout."""

    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        with _writing(request, self):
            return super().changeform_view(request, *args, **kwargs)  # type: ignore[misc]

    def delete_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        with _writing(request, self):
            return super().delete_view(request, *args, **kwargs)  # type: ignore[misc]


def _writing(request: HttpRequest, model_admin: Any) -> AbstractContextManager[Any]:
    if request.method != "POST":
        return contextlib.nullcontext()
    using = router.db_for_write(model_admin.model)
    return dialect_for(connections[using]).write_transaction()
