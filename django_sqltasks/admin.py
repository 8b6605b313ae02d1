"""A read-only admin for tasks and workers: find a task, see its arguments, result and errors."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from .models import TaskRecord, WorkerRecord

if TYPE_CHECKING:
    TaskAdminBase = admin.ModelAdmin[TaskRecord]
    WorkerAdminBase = admin.ModelAdmin[WorkerRecord]
else:
    TaskAdminBase = WorkerAdminBase = admin.ModelAdmin

STATUS_COLOURS = {
    "READY": "#2563eb",
    "RUNNING": "#d97706",
    "SUCCESSFUL": "#16a34a",
    "FAILED": "#dc2626",
}


def _pretty(value: Any) -> str:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, ensure_ascii=False))


@admin.register(TaskRecord)
class TaskRecordAdmin(TaskAdminBase):
    list_display = (
        "task_name",
        "status_badge",
        "queue_name",
        "priority",
        "enqueued_at",
        "started_at",
        "finished_at",
        "attempts",
    )
    list_filter = ("status", "queue_name", "backend_name")
    search_fields = ("=id", "task_path")
    ordering = ("-enqueued_at",)
    date_hierarchy = None
    list_per_page = 50
    show_full_result_count = False
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "task_path",
                    "status_badge",
                    "backend_name",
                    "queue_name",
                    "priority",
                )
            },
        ),
        (_("Call"), {"fields": ("args_display", "kwargs_display")}),
        (_("Outcome"), {"fields": ("return_value_display", "errors_display")}),
        (_("Attempts"), {"fields": ("attempts", "worker_ids", "owner")}),
        (
            _("Times"),
            {
                "fields": (
                    "enqueued_at",
                    "run_after",
                    "available_at",
                    "started_at",
                    "last_attempted_at",
                    "finished_at",
                )
            },
        ),
    )
    readonly_fields = (
        "id",
        "task_path",
        "status_badge",
        "backend_name",
        "queue_name",
        "priority",
        "args_display",
        "kwargs_display",
        "return_value_display",
        "errors_display",
        "attempts",
        "worker_ids",
        "owner",
        "enqueued_at",
        "run_after",
        "available_at",
        "started_at",
        "last_attempted_at",
        "finished_at",
    )

    @admin.display(description=_("task"), ordering="task_path")
    def task_name(self, obj: TaskRecord) -> str:
        return obj.task_name

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: TaskRecord) -> str:
        return format_html(
            '<span class="sqltasks-status" data-status="{}" style="background:{};color:#fff;'
            'padding:2px 8px;border-radius:10px;font-size:11px;font-weight:600">{}</span>',
            obj.status,
            STATUS_COLOURS.get(obj.status, "#6b7280"),
            obj.get_status_display(),
        )

    @admin.display(description=_("args"))
    def args_display(self, obj: TaskRecord) -> str:
        return _pretty(obj.args)

    @admin.display(description=_("kwargs"))
    def kwargs_display(self, obj: TaskRecord) -> str:
        return _pretty(obj.kwargs)

    @admin.display(description=_("return value"))
    def return_value_display(self, obj: TaskRecord) -> str:
        return _pretty(obj.return_value) if obj.status == "SUCCESSFUL" else "—"

    @admin.display(description=_("errors"))
    def errors_display(self, obj: TaskRecord) -> str:
        if not obj.errors:
            return "—"
        return format_html_join(
            "",
            '<div class="sqltasks-error"><strong>{}. {}</strong><pre>{}</pre></div>',
            (
                (number, error.get("exception_class_path", ""), error.get("traceback", ""))
                for number, error in enumerate(obj.errors, start=1)
            ),
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(WorkerRecord)
class WorkerRecordAdmin(WorkerAdminBase):
    list_display = (
        "id",
        "hostname",
        "pid",
        "backend_name",
        "concurrency",
        "started_at",
        "heartbeat_at",
    )
    ordering = ("-heartbeat_at",)
    readonly_fields = (
        "id",
        "hostname",
        "pid",
        "backend_name",
        "queue_names",
        "concurrency",
        "started_at",
        "heartbeat_at",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
