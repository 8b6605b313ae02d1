"""The admin's read-only list of concurrency and rate limits, with what each holds now."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext_lazy as _

from ..models import TaskLimit, TaskRecord
from .display import cut_html
from .lists import WritesLocked

if TYPE_CHECKING:
    LimitAdminBase = admin.ModelAdmin[TaskLimit]
else:
    LimitAdminBase = admin.ModelAdmin


@admin.register(TaskLimit)
class TaskLimitAdmin(WritesLocked, LimitAdminBase):
    """Each limit workers enforce: its numbers as last written, its RUNNING and waiting tasks."""

    list_display = (
        "key_display",
        "backend_name",
        "concurrency",
        "rate_display",
        "running",
        "waiting",
    )
    list_display_links = ("key_display",)
    list_filter = ("backend_name",)
    search_fields = ("key",)
    list_per_page = 50
    readonly_fields = ("backend_name", "key", "concurrency", "rate", "period", "updated_at")
    exclude = ("starts",)

    @admin.display(description=_("key"), ordering="key")
    def key_display(self, obj: TaskLimit) -> str:
        return cut_html(obj.key)

    @admin.display(description=_("rate limit"))
    def rate_display(self, obj: TaskLimit) -> str:
        if obj.rate is None or obj.period is None:
            return "-"
        unit = {1.0: "s", 60.0: "m", 3600.0: "h"}.get(obj.period, f"{obj.period:g}s")
        return f"{obj.rate}/{unit}"

    @admin.display(description=_("running"))
    def running(self, obj: TaskLimit) -> int:
        return self._tasks(obj).filter(status="RUNNING").count()

    @admin.display(description=_("waiting"))
    def waiting(self, obj: TaskLimit) -> int:
        # Each count names limit_key, so it reads a partial index of the claim's READY rows
        # (READY alone matches none of them, and would scan the table).
        ready = self._tasks(obj).filter(status="READY")
        return sum(ready.filter(limit_key__isnull=isnull).count() for isnull in (True, False))

    @staticmethod
    def _tasks(obj: TaskLimit) -> QuerySet[TaskRecord]:
        tasks = TaskRecord.objects.filter(backend_name=obj.backend_name)
        if obj.key.startswith("queue:"):
            return tasks.filter(queue_name=obj.key[len("queue:") :])
        # A task's row also holds the rate of each of its keys' tasks.
        return tasks.filter(Q(limit_key=obj.key) | Q(limit_key__startswith=obj.key + "#"))

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # As the task list: at 1280 px the app navigation would push Waiting out of sight.
        context = {"is_nav_sidebar_enabled": False, **(extra_context or {})}
        return super().changelist_view(request, context)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: TaskLimit | None = None) -> bool:
        return False
