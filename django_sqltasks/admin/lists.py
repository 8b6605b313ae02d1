"""What keeps the admin's lists fast at any size and safe: estimated counts, pages read by id,
filters that list what is declared instead of reading rows, no NUL queries, and pages that
write without failing on a busy SQLite database."""

from __future__ import annotations

import contextlib
import uuid
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import EmptyPage, Page, Paginator
from django.db import connections, router
from django.db.models import F, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..core.backends import sql_backends
from ..core.tags import is_tag
from ..models import PausedQueue, TaskRecord, WorkerRecord
from ..ops.declared import declared_tags, declared_task_paths
from ..ops.search import SEARCH_ALIAS, by_column
from ..sql import dialect_for
from ..sql.lists import estimated_rows, ready_queue_names

EXACT_COUNT_BELOW = 1000  # rows: results smaller than this are counted exactly
ESTIMATE_ABOVE = 10_000  # rows: a larger estimate is shown without counting any row
# How far back a page is read first, then further: see newest.
ID_WINDOWS = (timedelta(hours=1), timedelta(days=1), timedelta(days=7), timedelta(days=31), None)
MAX_PAGES = 20  # pages of a list: past them, a filter or a search narrows it


class EstimatedCountPaginator(Paginator):
    """Count a list without reading it all, and page it without reading every match.

    Where the database estimates ``ESTIMATE_ABOVE`` rows or more (PostgreSQL's planner, whose
    statistics say so well for a status, a queue or a task; MariaDB's table statistics for the
    whole table), that estimate is shown as "about N" and no row is counted. Otherwise a
    bounded count reads at most ``EXACT_COUNT_BELOW`` matching rows: fewer are counted
    exactly; that many are shown as "more than N", as a smaller estimate cannot be trusted (a
    search's, or a table's never analysed).

    A page reads its rows' ids first, then those rows; and a list has at most ``MAX_PAGES``
    pages: an operator narrows a long list with a filter or a search instead. A result the
    bounded count read whole is paged from the ids it read; a larger one (counted or estimated)
    is read among the newest ids first (``newest``), where such matches are dense enough to
    fill a page soon.
    """

    estimated = False  # the count is the database's estimate: "about N"
    capped = False  # the count stopped at EXACT_COUNT_BELOW: "more than N"
    # Every matching id, when the bounded count read them all (fewer than EXACT_COUNT_BELOW):
    # a page then takes its ids from these, and reads only its own rows.
    all_ids: list[Any] | None = None

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return super().count
        estimate = self.estimate
        if estimate is not None and estimate >= ESTIMATE_ABOVE:
            self.estimated = True
            return estimate
        # In no order, so that the database reads the matches the cheapest way (a search's
        # index, a bitmap), not the primary key's order row by row.
        ids = list(queryset.order_by().values_list("pk", flat=True)[:EXACT_COUNT_BELOW])
        if len(ids) >= EXACT_COUNT_BELOW:
            self.capped = True
        else:
            self.all_ids = ids
        return len(ids)

    @cached_property
    def estimate(self) -> int | None:
        """The database's estimate of the rows of the list (None: it has none)."""
        return estimated_rows(self.object_list)  # type: ignore[arg-type]

    @cached_property
    def windows(self) -> tuple[timedelta | None, ...]:
        """How far back a page is read, in turn (None: the whole table): by windows of the
        newest ids where the matches are many, which ``count`` found or the estimate says.

        Read whole, newest first, a list of many matches costs little on one table but, on
        PostgreSQL's day partitions, each partition is read from its newest id down to its
        first match: a partition holding none (a queue whose tasks never fail, in the FAILED
        days; a queue added last week, in the older ones) is read through. A window bounds
        every partition's read by id."""
        many = self.estimated or (self.count >= EXACT_COUNT_BELOW and self.capped)
        return ID_WINDOWS if many else (None,)

    @property
    def count_label(self) -> str:
        """The count as the list shows it: exact, "about N" or "more than N"."""
        if self.estimated:
            return _("about %(count)s") % {"count": f"{self.count:,}"}
        if self.capped:
            return _("more than %(count)s") % {"count": f"{self.count:,}"}
        return f"{self.count:,}"

    @cached_property
    def num_pages(self) -> int:
        if self.capped:  # more than counted: as many pages as a list shows
            return MAX_PAGES
        return min(super().num_pages, MAX_PAGES)

    def validate_number(self, number: Any) -> int:
        # A page past the numbered ones (an old bookmark, ?p=500) shows the last numbered one.
        try:
            return super().validate_number(number)
        except EmptyPage:
            return self.num_pages

    def page(self, number: Any) -> Page:
        number = self.validate_number(number)
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return super().page(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if self.all_ids is not None:
            return Page(self.counted_rows(bottom, top), number, self)
        if bottom == 0:  # the first page: its rows at once, newest first
            return Page(newest(queryset, 0, top, self.windows), number, self)
        ids = newest(queryset.values_list("pk", flat=True), bottom, top, self.windows)
        return Page(queryset.filter(pk__in=ids), number, self)

    def counted_rows(self, bottom: int = 0, top: int | None = None) -> list[Any]:
        """Rows ``bottom`` to ``top`` of a list whose every id the count read (``all_ids``),
        newest first: read by those ids only, not by the list's filters again."""
        queryset = self.object_list
        all_ids = self.all_ids
        assert isinstance(queryset, QuerySet) and all_ids is not None
        if not dialect_for(connections[queryset.db]).orders_uuids_as_python:
            # The database orders the ids the count read, reading only their rows (none,
            # for an empty result).
            return list(by_ids(queryset, all_ids)[bottom:top])
        ids = sorted(all_ids, reverse=True)[bottom:top]  # newest first is the ids' order
        return list(by_ids(queryset, ids))


def by_ids(queryset: QuerySet[Any], ids: list[Any]) -> QuerySet[Any]:
    """The rows of ``ids``, as ``queryset`` reads them (its related rows, deferred columns
    and order) but without its filters, which chose those ids already: a search's
    expressions cost the planner a few ms in each of PostgreSQL's day partitions."""
    rows = queryset.model._base_manager.db_manager(queryset.db).filter(pk__in=ids)
    rows.query.select_related = queryset.query.select_related
    rows.query.deferred_loading = queryset.query.deferred_loading
    return rows.order_by(*queryset.query.order_by)


def newest(
    queryset: QuerySet[Any],
    bottom: int,
    top: int,
    windows: tuple[timedelta | None, ...] = ID_WINDOWS,
) -> list[Any]:
    """Rows (or ids) ``bottom`` to ``top`` of ``queryset``, newest first, read among the
    newest ids first and further back only while too few match.

    The rows a search or a filter selects may be many and spread over the whole table (every
    task that failed with ValueError): read all, then sorted, they cost seconds. The ``top``
    newest are the same among the ids of the last hour as among all, once that hour holds
    ``top`` of them; ids are UUIDv7, so a window of time is a range of the primary key.
    """
    now = timezone.now()
    queryset = sorted_after_found(queryset)
    for window in windows:
        rows = queryset if window is None else queryset.filter(pk__gte=id_floor(now - window))
        found = list(rows[bottom:top])
        if window is None or len(found) == top - bottom:
            return found
    raise AssertionError("unreachable: the last window is the whole table")


def sorted_after_found(queryset: QuerySet[Any]) -> QuerySet[Any]:
    """``queryset``, newest first; where it is narrowed through PostgreSQL's search index
    (``ops.search``), sorted after its matches are found.

    Ordered by the primary key with a LIMIT, the planner may read a window's rows newest
    first and test each against the search, when its guess of how many match is high: the
    test computes each row's argument values, and a tag search at 50 million tasks took
    782 ms so in one run and 90 ms in the run before (the same data, analysed again).
    ``DESC NULLS LAST`` is the same order for a primary key, and no index reads in it: the
    matches are found through the indexes, then sorted.
    """
    if SEARCH_ALIAS not in queryset.query.annotations:
        return queryset
    return queryset.order_by(F("pk").desc(nulls_last=True))


def id_floor(moment: datetime) -> uuid.UUID:
    """The smallest UUIDv7 of ``moment``'s millisecond."""
    return uuid.UUID(int=(int(moment.timestamp() * 1000) << 80) | (7 << 76))


class TaskChangeList(ChangeList):
    """The task list: a page past the last one (an old bookmark, ``?p=500``) shows the last;
    a list of one page is read by the ids its count read."""

    def get_results(self, request: HttpRequest) -> None:
        self.page_num = max(1, min(self.page_num, MAX_PAGES))
        super().get_results(request)
        paginator = self.paginator
        one_page = not self.multi_page or (self.show_all and self.can_show_all)
        if (
            one_page
            and isinstance(paginator, EstimatedCountPaginator)
            and paginator.all_ids is not None
        ):
            # Django reads a list that fits one page whole, by its filters and search again
            # and in its order, past the paginator: a search that found one task among 50
            # million read every partition again so (26 ms, in parallel workers), where the
            # ids the count read find it by the primary key (and an empty list reads nothing).
            self.result_list = paginator.counted_rows()


class QueueFilter(admin.SimpleListFilter):
    """Queues from the settings, live workers, paused queues, and queues with waiting tasks.

    Waiting tasks' queues are read by a skip scan of the claim's index, one probe per queue
    (``sql.lists.ready_queue_names``): never a DISTINCT over the table's rows.
    """

    title = _("queue")
    parameter_name = "queue_name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        backends = sql_backends()
        names = {name for backend in backends.values() for name in backend.queues}
        tasks = TaskRecord.objects.all()
        for alias in backends:
            names.update(ready_queue_names(tasks, alias))
        for queues in WorkerRecord.objects.values_list("queue_names", flat=True):
            names.update(name for name in queues if name != "*")
        names.update(PausedQueue.objects.values_list("queue_name", flat=True))
        if self.value():
            names.add(str(self.value()))
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        return by_column(queryset, "queue_name", str(value)) if value else queryset


class TaskFilter(admin.SimpleListFilter):
    """Every task the project declares (``ops.declared``), not only those in recent rows."""

    title = _("task")
    parameter_name = "task_path"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        paths = set(declared_task_paths())
        if self.value():
            paths.add(str(self.value()))
        return [(p, p.rsplit(".", 1)[-1] + f" ({p.rsplit('.', 1)[0]})") for p in sorted(paths)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        return by_column(queryset, "task_path", str(value)) if value else queryset


class TagFilter(admin.SimpleListFilter):
    """The tags the declared tasks set (``@task(tags=...)``); a tag set with ``using()`` is
    found by the search, or by this filter's URL (``?tag=...``)."""

    title = _("tag")
    parameter_name = "tag"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        tags = set(declared_tags())
        if self.value():
            tags.add(str(self.value()))
        return [(tag, tag) for tag in sorted(tags)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        return queryset if not value else with_tag(queryset, str(value))


def with_tag(queryset: QuerySet[Any], tag: str) -> QuerySet[Any]:
    """The tasks of ``queryset`` tagged ``tag``: through the tag index on PostgreSQL."""
    if not is_tag(tag):
        return queryset.none()
    if dialect_for(connections[queryset.db]).indexes_json_values:
        return queryset.filter(tags__contains=[tag])
    return queryset.filter(tags__icontains=f'"{tag}"')  # no quote in a tag: exactly this one


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
