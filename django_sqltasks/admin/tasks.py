"""The admin: find any task, see why it failed, retry or cancel it, and watch every queue."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST

from ..compat import TaskResultStatus
from ..core import error_text
from ..core.settings import sql_backends
from ..models import FINISHED_STATUSES, TaskRecord
from ..store import control
from . import progress as admin_progress
from .display import cut_html, error_summary_html, moment_html, pretty, status_badge_html
from .lists import (
    EstimatedCountPaginator,
    NulSafeAdmin,
    QueueFilter,
    SQLBackendFilter,
    TaskFilter,
)
from .workflows import workflow_html

if TYPE_CHECKING:
    TaskAdminBase = admin.ModelAdmin[TaskRecord]
else:
    TaskAdminBase = admin.ModelAdmin


@admin.register(TaskRecord)
class TaskRecordAdmin(NulSafeAdmin, TaskAdminBase):
    # Fits 1280 px beside the filter sidebar (see changelist_view): priority and the start and
    # finish times are on the task's page.
    list_display = (
        "task_name",
        "status_badge",
        "error_summary",
        "queue",
        "enqueued_display",
        "duration_display",
        "attempts",
    )
    list_filter = ("status", QueueFilter, TaskFilter, SQLBackendFilter)
    search_fields = ("=id", "task_path")
    ordering = ("-id",)  # newest first: ids are UUIDv7 (see TaskRecord.Meta)
    list_per_page = 50
    # Counting the rows of every filtered page exactly would scan; see EstimatedCountPaginator.
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    # delete_selected replaces the site-wide action of that name: it deletes finished tasks only.
    actions = ("retry_tasks", "cancel_tasks", "run_now", "delete_selected")
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
        (_("Progress"), {"fields": ("progress_display", "metadata_display")}),
        (_("Outcome"), {"fields": ("return_value_display", "errors_display")}),
        (
            _("Attempts"),
            {"fields": ("attempts", "rescues", "snoozes", "worker_ids", "owner", "limit_key")},
        ),
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
                    "duration_display",
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
        "progress_display",
        "metadata_display",
        "attempts",
        "rescues",
        "snoozes",
        "limit_key",
        "worker_ids",
        "owner",
        "enqueued_at",
        "run_after",
        "available_at",
        "started_at",
        "last_attempted_at",
        "finished_at",
        "duration_display",
        "workflow_display",
    )

    @admin.display(description=_("task"), ordering="task_path")
    def task_name(self, obj: TaskRecord) -> str:
        return cut_html(obj.task_name, obj.task_path)

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: TaskRecord) -> str:
        badge = status_badge_html(obj.status, obj.get_status_display())
        return format_html("{}{}", badge, admin_progress.progress_list_html(obj))

    @admin.display(description=_("progress"))
    def progress_display(self, obj: TaskRecord) -> str:
        return admin_progress.progress_detail_html(obj)

    @admin.display(description=_("metadata"))
    def metadata_display(self, obj: TaskRecord) -> str:
        return admin_progress.metadata_html(obj)

    @admin.display(description=_("queue"), ordering="queue_name")
    def queue(self, obj: TaskRecord) -> str:
        return cut_html(obj.queue_name)

    @admin.display(description=_("error"))
    def error_summary(self, obj: TaskRecord) -> str:
        # A finished task's last error says why it failed; a READY one's, why it is retried.
        if obj.status == TaskResultStatus.SUCCESSFUL:
            return "—"
        return error_summary_html(obj.errors)

    @admin.display(description=_("enqueued"), ordering="enqueued_at")
    def enqueued_display(self, obj: TaskRecord) -> str:
        return moment_html(obj.enqueued_at)

    @admin.display(description=_("duration"))
    def duration_display(self, obj: TaskRecord) -> str:
        duration = obj.duration
        if duration is None:
            return "—"
        seconds = duration.total_seconds()
        return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"

    @admin.display(description=_("args"))
    def args_display(self, obj: TaskRecord) -> str:
        return pretty(obj.args)

    @admin.display(description=_("kwargs"))
    def kwargs_display(self, obj: TaskRecord) -> str:
        return pretty(obj.kwargs)

    @admin.display(description=_("return value"))
    def return_value_display(self, obj: TaskRecord) -> str:
        return pretty(obj.return_value) if obj.status == "SUCCESSFUL" else "—"

    @admin.display(description=_("errors"))
    def errors_display(self, obj: TaskRecord) -> str:
        if not obj.errors:
            return "—"
        return format_html_join(
            "",
            '<div class="sqltasks-error"><strong>{}. {}</strong><p class="sqltasks-error-message">'
            "{}</p><pre>{}</pre></div>",
            (
                (
                    number,
                    error.get("exception_class_path", ""),
                    error_text.first_line(
                        str(error.get("exception_class_path", "")), str(error.get("traceback", ""))
                    ),
                    error.get("traceback", ""),
                )
                for number, error in enumerate(obj.errors, start=1)
            ),
        )

    @admin.display(description=_("workflow"))
    def workflow_display(self, obj: TaskRecord) -> str:
        return workflow_html(obj, obj._state.db or "default")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = list(super().get_fieldsets(request, obj))
        if obj is not None and obj.workflow_id is not None:
            fieldsets.insert(1, (_("Workflow"), {"fields": ("workflow_display",)}))
        if obj is not None and obj.status == TaskResultStatus.FAILED:
            # Why it failed is what a failed task's page is opened for: put it first.
            fieldsets.sort(key=lambda fieldset: fieldset[0] != _("Outcome"))
        return fieldsets

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # The list needs the width more than the app navigation, which the breadcrumbs and
        # the admin index also give: at 1280 px the two sidebars leave the table 630 px.
        context = {"is_nav_sidebar_enabled": False, **(extra_context or {})}
        return super().changelist_view(request, context)

    # Permissions ---------------------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A running task's worker would finish it and find the row gone: delete finished only.
        if obj is not None and obj.status not in FINISHED_STATUSES:
            return False
        return super().has_delete_permission(request, obj)

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_sqltasks.retry_taskrecord")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_sqltasks.cancel_taskrecord")

    def has_run_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_sqltasks.run_taskrecord")

    # Actions -------------------------------------------------------------------------------

    @admin.action(description=_("Retry selected failed tasks"), permissions=["retry"])
    def retry_tasks(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> None:
        failed = queryset.filter(status=TaskResultStatus.FAILED)
        done = control.retry(failed, using=queryset.db)
        self._log(request, done, "Retried: FAILED to READY, errors and attempts kept.")
        self._report(request, len(done), queryset.count(), _("retried"), _("were not FAILED"))

    @admin.action(
        description=_("Cancel selected tasks (running async tasks at their next heartbeat)"),
        permissions=["cancel"],
    )
    def cancel_tasks(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> None:
        ready = queryset.filter(status=TaskResultStatus.READY)
        reason = f"Cancelled in the admin by {request.user.get_username()} before it started."
        done = control.cancel(ready, using=queryset.db, reason=reason)
        self._log(request, done, "Cancelled: READY to FAILED (TaskCancelled).")
        running = queryset.filter(status=TaskResultStatus.RUNNING)
        asked = control.request_cancel(running, using=queryset.db)
        self._log(request, asked, "Cancellation requested of a RUNNING task.")
        self._report(
            request, len(done), queryset.count() - len(asked), _("cancelled"), _("had started")
        )
        if asked:
            self.message_user(
                request,
                f"{len(asked)} running task(s) asked to stop: async tasks are cancelled at their "
                "worker's next heartbeat; sync tasks cannot be interrupted.",
                messages.INFO,
            )

    @admin.action(description=_("Run selected deferred tasks now"), permissions=["run"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> None:
        backends = sql_backends()
        done = [
            record
            for record in queryset.filter(status=TaskResultStatus.READY)
            if record.backend_name in backends
            and backends[record.backend_name].run_now(str(record.pk))
        ]
        self._log(request, done, "Made due now (run now).")
        self._report(request, len(done), queryset.count(), _("made due now"), _("were not READY"))

    @admin.action(description=_("Delete selected finished tasks"), permissions=["delete"])
    def delete_selected(
        self, request: HttpRequest, queryset: QuerySet[TaskRecord]
    ) -> HttpResponse | None:
        # Django's confirmation page, logging and deletion, limited to finished tasks.
        return django_delete_selected(self, request, queryset.filter(status__in=FINISHED_STATUSES))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> None:
        queryset.filter(status__in=FINISHED_STATUSES).delete()

    def _log(self, request: HttpRequest, records: list[TaskRecord], message: str) -> None:
        if records:
            LogEntry.objects.log_actions(
                user_id=request.user.pk,  # type: ignore[arg-type]
                queryset=records,
                action_flag=CHANGE,
                change_message=message,
            )

    def _report(
        self, request: HttpRequest, done: int, selected: int, verb: Any, reason: Any
    ) -> None:
        self.message_user(request, f"{done} task(s) {verb}.", messages.SUCCESS)
        if selected > done:
            self.message_user(
                request, f"{selected - done} task(s) skipped: they {reason}.", messages.WARNING
            )

    # Buttons on the detail page ------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        opts = self.model._meta
        name = f"{opts.app_label}_{opts.model_name}"
        view = self.admin_site.admin_view
        return [
            path(
                "<path:object_id>/retry/",
                view(require_POST(self.retry_view)),
                name=f"{name}_retry",
            ),
            path(
                "<path:object_id>/cancel/",
                view(require_POST(self.cancel_view)),
                name=f"{name}_cancel",
            ),
            *super().get_urls(),
        ]

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not self.has_retry_permission(request):
            raise PermissionDenied
        self.retry_tasks(request, self._one(request, object_id))
        return self._back_to(object_id)

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not self.has_cancel_permission(request):
            raise PermissionDenied
        self.cancel_tasks(request, self._one(request, object_id))
        return self._back_to(object_id)

    def _one(self, request: HttpRequest, object_id: str) -> QuerySet[TaskRecord]:
        try:
            task_id = uuid.UUID(object_id)
        except ValueError as e:  # not a task id: no such task, rather than a server error
            raise Http404(f"No task has the id {object_id!r}.") from e
        record = get_object_or_404(self.get_queryset(request), pk=task_id)
        return self.get_queryset(request).filter(pk=record.pk)

    def _back_to(self, object_id: str) -> HttpResponse:
        return HttpResponseRedirect(
            reverse("admin:django_sqltasks_taskrecord_change", args=[object_id])
        )

    def render_change_form(
        self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any
    ) -> HttpResponse:
        obj = context.get("original")
        context["can_retry"] = (
            obj is not None
            and obj.status == TaskResultStatus.FAILED
            and self.has_retry_permission(request)
        )
        context["can_cancel"] = (
            obj is not None
            and obj.status in (TaskResultStatus.READY, TaskResultStatus.RUNNING)
            and self.has_cancel_permission(request)
        )
        return super().render_change_form(request, context, *args, **kwargs)
