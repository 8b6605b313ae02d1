"""The admin: find any task, see why it failed, retry or cancel it, and watch every queue."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from ..compat import TaskResultStatus
from ..core import error_text
from ..models import FINISHED_STATUSES, StepRecord, TaskRecord
from ..ops import search
from . import durable
from . import progress as admin_progress
from .display import (
    attempts_html,
    cut_html,
    error_summary_html,
    full_time_html,
    moment_html,
    pretty,
    status_badge_html,
    tags_html,
)
from .lists import (
    EstimatedCountPaginator,
    NulSafeAdmin,
    QueueFilter,
    SQLBackendFilter,
    TagFilter,
    TaskChangeList,
    TaskFilter,
    WritesLocked,
)
from .task_actions import TaskActions, TaskAdminBase, runs_async
from .workflows import workflow_html


def time_field(name: str, label: Any, parked: Any = "") -> Any:
    """A read-only display of the time column ``name``, to the second."""

    @admin.display(description=label, ordering=name)
    def show(self: Any, obj: TaskRecord) -> str:
        return full_time_html(getattr(obj, name), str(parked))

    return show


TIME_FIELDS = (
    "enqueued_at_display",
    "run_after_display",
    "available_at_display",
    "started_at_display",
    "last_attempted_at_display",
    "finished_at_display",
    "duration_display",
)


@admin.register(TaskRecord)
class TaskRecordAdmin(WritesLocked, NulSafeAdmin, TaskActions, TaskAdminBase):
    # Fits 1280 px beside the filter sidebar (see changelist_view): priority and the start and
    # finish times are on the task's page.
    list_display = (
        "task_name",
        "status_badge",
        "error_summary",
        "queue",
        "enqueued_display",
        "duration_display",
        "attempts_display",
        "tags_display",
    )
    list_filter = (
        "status",
        durable.WaitingFilter,
        QueueFilter,
        TaskFilter,
        TagFilter,
        SQLBackendFilter,
    )
    # The search box finds a task by id, argument value, subject, error class or tag
    # (get_search_results, ops/search.py); Django's own search would scan the table.
    search_fields = ("=id",)
    search_help_text = _(
        "A task id, a value of its arguments (an e-mail, an order number), its subject "
        "(app_label.model:pk), the class of the error it failed with, or a tag."
    )
    # Sorting by a column would sort every matching row: the list stays newest first, the
    # order the primary key gives.
    sortable_by = ()
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
                    "tags_display",
                )
            },
        ),
        (_("Call"), {"fields": ("args_display", "kwargs_display")}),
        (_("Progress"), {"fields": ("progress_display", "metadata_display")}),
        (_("Outcome"), {"fields": ("return_value_display", "errors_display")}),
        (
            _("Attempts"),
            {
                "fields": (
                    "attempts_display",
                    "rescues",
                    "snoozes",
                    "worker_ids",
                    "owner",
                    "limit_key",
                )
            },
        ),
        (_("Times"), {"fields": TIME_FIELDS}),
    )
    readonly_fields = (
        "id",
        "task_path",
        "status_badge",
        "backend_name",
        "queue_name",
        "priority",
        "tags_display",
        "args_display",
        "kwargs_display",
        "return_value_display",
        "errors_display",
        "progress_display",
        "metadata_display",
        "attempts_display",
        "rescues",
        "snoozes",
        "limit_key",
        "worker_ids",
        "owner",
        *TIME_FIELDS,
        "workflow_display",
        "steps_display",
        "waiting_display",
    )

    # Times to the second (Django's default DATETIME_FORMAT stops at the minute).
    enqueued_at_display = time_field("enqueued_at", _("enqueued at"))
    run_after_display = time_field("run_after", _("run after"))
    available_at_display = time_field(
        "available_at",
        _("available at"),
        parked=_("when the workflow steps before it have ended"),
    )
    started_at_display = time_field("started_at", _("started at"))
    last_attempted_at_display = time_field("last_attempted_at", _("last attempted at"))
    finished_at_display = time_field("finished_at", _("finished at"))

    @admin.display(description=_("task"), ordering="task_path")
    def task_name(self, obj: TaskRecord) -> str:
        return cut_html(obj.task_name, obj.task_path)

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: TaskRecord) -> str:
        badge = status_badge_html(obj.status, obj.get_status_display())
        return format_html("{}{}", badge, admin_progress.progress_list_html(obj))

    @admin.display(description=_("tags"))
    def tags_display(self, obj: TaskRecord) -> str:
        return tags_html(obj.tags)

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

    @admin.display(description=_("attempts"))
    def attempts_display(self, obj: TaskRecord) -> str:
        # As TaskResult.attempts and context.attempt count: every run, a durable task's
        # resumptions and a snoozed task's runs included; the column counts those charged
        # against max_attempts.
        return attempts_html(len(obj.worker_ids), obj.attempts)

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
        errors = error_text.stored_errors(obj.errors)
        if not errors:
            return "—"
        return format_html_join("", "{}", ((error_html(n, e),) for n, e in enumerate(errors, 1)))

    @admin.display(description=_("workflow"))
    def workflow_display(self, obj: TaskRecord) -> str:
        return workflow_html(obj, obj._state.db or "default")

    @admin.display(description=_("steps"))
    def steps_display(self, obj: TaskRecord) -> str:
        return durable.steps_html(obj, obj._state.db or "default")

    @admin.display(description=_("waits for"))
    def waiting_display(self, obj: TaskRecord) -> str:
        return durable.waiting_html(obj, obj._state.db or "default")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = list(super().get_fieldsets(request, obj))
        if obj is not None and durable.waiting_record(obj, obj._state.db or "default"):
            fieldsets.insert(1, (_("Waiting"), {"fields": ("waiting_display",)}))
        if obj is not None and events_exist(obj):
            fieldsets.insert(2, (_("Steps"), {"fields": ("steps_display",)}))
        if obj is not None and obj.workflow_id is not None:
            fieldsets.insert(1, (_("Workflow"), {"fields": ("workflow_display",)}))
        if obj is not None and obj.status == TaskResultStatus.FAILED:
            # Why it failed is what a failed task's page is opened for: put it first.
            fieldsets.sort(key=lambda fieldset: fieldset[0] != _("Outcome"))
        return fieldsets

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[TaskChangeList]:
        return TaskChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[TaskRecord], search_term: str
    ) -> tuple[QuerySet[TaskRecord], bool]:
        found = search.search(queryset, search_term)  # type: ignore[arg-type]
        if found.windowed:
            request.sqltasks_search_window = search.SEARCH_WINDOW  # type: ignore[attr-defined]
        return found.tasks, False

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

    def render_change_form(
        self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any
    ) -> HttpResponse:
        obj = context.get("original")
        context["can_retry"] = (
            obj is not None
            and obj.status == TaskResultStatus.FAILED
            and not (obj.workflow_id is not None and obj.attempts == 0)  # as retryable()
            and self.has_retry_permission(request)
        )
        context["can_cancel"] = (
            obj is not None
            and (
                obj.status == TaskResultStatus.READY
                or (obj.status == TaskResultStatus.RUNNING and not obj.cancel_requested)
            )
            and self.has_cancel_permission(request)
        )
        if obj is not None and context["can_cancel"]:
            context["cancel_label"], context["cancel_help"] = cancel_button(obj)
        waiting = durable.waiting_record(obj, obj._state.db or "default") if obj else None
        can_run = self.has_run_permission(request)
        context["can_end_wait"] = waiting is not None and can_run
        context["can_send_event"] = waiting is not None and waiting.kind == "event" and can_run
        return super().render_change_form(request, context, *args, **kwargs)


def cancel_button(obj: TaskRecord) -> tuple[Any, Any]:
    """The Cancel button's label and tooltip: what it does to this task."""
    if obj.status == TaskResultStatus.READY:
        return _("Cancel"), _("It ends FAILED with a TaskCancelled error, and does not run.")
    if runs_async(obj.task_path):
        return _("Cancel at its next heartbeat"), _(
            "Its worker cancels it at its next heartbeat: it ends FAILED with a TaskCancelled "
            "error."
        )
    return _("Cancel if not started yet"), _(
        "A sync task that has started cannot be interrupted and runs to its end; this cancels "
        "it only if its worker has not started it yet (a prefetched task)."
    )


def events_exist(obj: TaskRecord) -> bool:
    """Whether the task recorded any step, sleep or wait."""
    return StepRecord.objects.using(obj._state.db or "default").filter(task_id=obj.pk).exists()


def error_html(number: int, error: dict[str, str]) -> str:
    """One stored error: its class, its message's first line, and its traceback; an error
    recorded as a reason (cancelled, a workflow step that never ran) is shown whole, once."""
    class_path, text = error["exception_class_path"], error["traceback"]
    if not text.lstrip().startswith(error_text.TRACEBACK_START):
        return format_html(
            '<div class="sqltasks-error"><strong>{}. {}</strong>'
            '<p class="sqltasks-error-message">{}</p></div>',
            number,
            class_path or _("(no exception class stored)"),
            text,
        )
    return format_html(
        '<div class="sqltasks-error"><strong>{}. {}</strong><p class="sqltasks-error-message">'
        "{}</p><pre>{}</pre></div>",
        number,
        class_path,
        error_text.first_line(class_path, text),
        text,
    )
