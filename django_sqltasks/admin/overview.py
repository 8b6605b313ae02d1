"""The admin's queue overview: every queue's counts, throughput and workers, and the buttons
that pause and resume a queue."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
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
from .chart import throughput_chart
from .display import BREADCRUMBS_LIST

if TYPE_CHECKING:
    OverviewAdminBase = admin.ModelAdmin[QueueOverview]
else:
    OverviewAdminBase = admin.ModelAdmin


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
        context = {
            **self.admin_site.each_context(request),
            "title": _("Queue overview"),
            "opts": self.model._meta,
            "overview": snapshot,
            "rows": [(q, overview.short_age(q.oldest_age(snapshot.now))) for q in snapshot.queues],
            "window": overview.short_age(snapshot.finished_window),
            # The task table's upkeep in one line, and what holds the horizon back, if known.
            "upkeep": table_health.summary(snapshot.health),
            "holder": table_health.horizon_holder(snapshot.health),
            "chart": throughput_chart(snapshot.throughput),
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
