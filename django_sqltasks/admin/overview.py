"""The admin's queue overview: every queue's counts, throughput and workers, and the buttons
that pause and resume a queue. A page shows QUEUES_PER_PAGE queues, the most due first, with
how many more there are and pages for them (10,000 queues rendered at once took a minute and
10 MB, every live update again); a name filter finds one."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST

from ..compat import InvalidTaskBackend
from ..core.backends import queues_on, sql_backend
from ..exceptions import UnknownQueue
from ..models import PausedQueue, QueueOverview, TaskRecord
from ..ops import health as table_health
from ..ops import overview
from ..ops.claims import describe, of_backend
from ..ops.horizon import horizon_holder
from ..ops.overview import QueueStats
from .chart import throughput_chart
from .display import BREADCRUMBS_LIST

if TYPE_CHECKING:
    OverviewAdminBase = admin.ModelAdmin[QueueOverview]
else:
    OverviewAdminBase = admin.ModelAdmin

QUEUES_PER_PAGE = 50  # queues one page of the overview shows, the most due first
MAX_FILTER = 200  # characters of a queue name filter kept (a queue name is at most 100)
_NEVER = datetime.max.replace(tzinfo=UTC)


def by_backlog(queue: QueueStats) -> tuple[Any, ...]:
    """The overview's order: the most due tasks first, then the longest wait, the most
    running, the most failed, then by name."""
    oldest = queue.oldest_due
    if oldest is not None and oldest.tzinfo is None:
        oldest = oldest.replace(tzinfo=UTC)
    return (-queue.due, oldest or _NEVER, -queue.running, -queue.failed, queue.backend, queue.queue)


def queue_page(
    queues: list[QueueStats], name: str, number: str | None
) -> tuple[Any, list[QueueStats]]:
    """The page ``number`` (1 if not a page) of ``queues`` whose name holds ``name`` (any
    case), the most due first; with the whole filtered list's paginator."""
    if name:
        folded = name.casefold()
        queues = [q for q in queues if folded in q.queue.casefold()]
    page = Paginator(sorted(queues, key=by_backlog), QUEUES_PER_PAGE).get_page(number)
    return page, list(page.object_list)


def claims_by_backend(workers: list[overview.WorkerStats]) -> list[tuple[str, str, int, int]]:
    """Each backend's claims over the last minute in a line, with how many of its workers
    published theirs and how many it has: (backend, line, reporting, workers)."""
    by_backend: dict[str, list[Any]] = {}
    for w in workers:
        by_backend.setdefault(w.backend, []).append(w.claims)
    found = []
    for backend, costs in sorted(by_backend.items()):
        claims = of_backend(costs)
        found.append((backend, describe(claims.cost), claims.reporting, claims.live))
    return found


@admin.register(QueueOverview)
class QueueOverviewAdmin(OverviewAdminBase):
    """The queue overview: listed in the admin index, shown instead of a change list."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_sqltasks.view_taskrecord")

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_sqltasks.pause_queue")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        opts = self.model._meta
        name = f"{opts.app_label}_{opts.model_name}"
        view = self.admin_site.admin_view
        return [
            path("", view(self.changelist_view), name=f"{name}_changelist"),
            path("pause/", view(require_POST(self.pause_view)), name=f"{name}_pause"),
            path("resume/", view(require_POST(self.resume_view)), name=f"{name}_resume"),
        ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        using = TaskRecord.objects.db
        snapshot = overview.take(using=using, configured=queues_on(using))
        name = request.GET.get("q", "").replace("\x00", "")[:MAX_FILTER].strip()
        page, shown = queue_page(snapshot.queues, name, request.GET.get("page"))
        paginator = page.paginator
        more = paginator.count - page.end_index() if shown else 0  # after this page

        def link(number: int) -> str:
            return "?" + urlencode({**({"q": name} if name else {}), "page": number})

        context = {
            **self.admin_site.each_context(request),
            "title": _("Queue overview"),
            "opts": self.model._meta,
            "overview": snapshot,
            "rows": [(q, overview.short_age(q.oldest_age(snapshot.now))) for q in shown],
            "queue_filter": name,
            "queue_page": page,
            "queues_total": len(snapshot.queues),
            "queues_matching": paginator.count,
            "queues_more": more,
            "next_url": link(page.next_page_number()) if page.has_next() else "",
            "previous_url": link(page.previous_page_number()) if page.has_previous() else "",
            "window": overview.short_age(snapshot.finished_window),
            # The task table's upkeep in one line, and what holds the horizon back, if known.
            "upkeep": table_health.summary(snapshot.health),
            "holder": horizon_holder(snapshot.health),
            "chart": throughput_chart(snapshot.throughput),
            # What each worker's claims, and each backend's, cost over the last minute.
            "workers": [(w, describe(w.claims)) for w in snapshot.workers],
            "claims": claims_by_backend(snapshot.workers),
            "tasks_url": reverse("admin:django_sqltasks_taskrecord_changelist"),
            "breadcrumbs_list": BREADCRUMBS_LIST,
            "can_pause": self.has_pause_permission(request),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/django_sqltasks/overview.html", context)

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        return self._pause_or_resume(request, pause=True)

    def resume_view(self, request: HttpRequest) -> HttpResponse:
        return self._pause_or_resume(request, pause=False)

    def _pause_or_resume(self, request: HttpRequest, *, pause: bool) -> HttpResponse:
        if not self.has_pause_permission(request):
            raise PermissionDenied
        alias = request.POST.get("backend", "")
        queue = request.POST.get("queue", "")
        try:
            backend = sql_backend(alias)
        except InvalidTaskBackend:
            self.message_user(request, f"No SQLTaskBackend is named {alias!r}.", messages.ERROR)
            return self._back()
        try:
            changed = backend.pause_queue(queue) if pause else backend.resume_queue(queue)
        except UnknownQueue as e:
            self.message_user(request, str(e), messages.ERROR)
            return self._back()
        verb = "paused" if pause else "resumed"
        if changed:
            self._log(request, f"Queue {queue!r} of backend {alias!r} {verb}.")
            self.message_user(request, f"Queue {queue!r} {verb}.", messages.SUCCESS)
        else:
            state = "paused already" if pause else "not paused"
            self.message_user(request, f"Queue {queue!r} was {state}.", messages.INFO)
        return self._back()

    def _log(self, request: HttpRequest, message: str) -> None:
        # No row to point at once a queue is resumed: the entry names the queue instead.
        LogEntry.objects.create(
            user_id=request.user.pk,  # type: ignore[misc]
            content_type=ContentType.objects.get_for_model(PausedQueue),
            object_repr=message[:200],
            action_flag=CHANGE,
            change_message=message,
        )

    def _back(self) -> HttpResponse:
        return HttpResponseRedirect(reverse("admin:django_sqltasks_queueoverview_changelist"))
