"""What an operator does to tasks from the admin: retry, cancel, run now, delete finished,
as list actions and as buttons on a task's page, each logged and checked against its
permission. A part of the task page (``admin/tasks.py``)."""

from __future__ import annotations

import uuid
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST

from ..compat import TaskResultStatus
from ..core.backends import sql_backends
from ..core.resolve import resolve_task
from ..exceptions import TaskNotFound
from ..models import FINISHED_STATUSES, TaskRecord, TaskRecordQuerySet
from ..store import bulk as store_bulk
from ..store import control, steps
from ..store.partitions import partitioned_recently
from . import bulk_actions as bulk
from . import durable
from .display import BREADCRUMBS_LIST

if TYPE_CHECKING:
    TaskAdminBase = admin.ModelAdmin[TaskRecord]
else:
    TaskAdminBase = admin.ModelAdmin


class TaskActions(TaskAdminBase):
    """The task page's actions and buttons (mixed into ``TaskRecordAdmin``)."""

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_sqltasks.retry_taskrecord")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_sqltasks.cancel_taskrecord")

    def has_run_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_sqltasks.run_taskrecord")

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        """The task of a page, read by id so that only the partitions it may be in are planned."""
        if from_field is not None:
            return super().get_object(request, object_id, from_field)
        try:
            task_id = uuid.UUID(object_id)
        except ValueError:
            return None  # not a task id: no such task
        tasks = cast(TaskRecordQuerySet, self.get_queryset(request))  # the model's manager's
        return tasks.with_id(task_id, partitioned=partitioned_recently(tasks.db)).first()

    # Actions -------------------------------------------------------------------------------

    @admin.action(description=_("Retry selected failed tasks"), permissions=["retry"])
    def retry_tasks(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> Any:
        if bulk.across(request):
            return bulk.confirm_or_queue(self, request, queryset, kind=store_bulk.RETRY)
        failed = retryable(queryset)
        done = control.retry(failed, using=queryset.db)
        self._log(request, done, "Retried: FAILED to READY, errors and attempts kept.")
        self._report(
            request,
            len(done),
            queryset.count(),
            _("retried"),
            _(
                "were not FAILED, or are workflow steps that never ran (their arguments come "
                "from the steps before them: retry the step that failed)"
            ),
        )

    @admin.action(
        description=_("Cancel selected tasks (running async tasks at their next heartbeat)"),
        permissions=["cancel"],
    )
    def cancel_tasks(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> Any:
        reason = f"Cancelled in the admin by {request.user.get_username()} before it started."
        if bulk.across(request):
            return bulk.confirm_or_queue(self, request, queryset, kind=store_bulk.CANCEL)
        ready = queryset.filter(status=TaskResultStatus.READY)
        done = control.cancel(ready, using=queryset.db, reason=reason)
        self._log(request, done, "Cancelled: READY to FAILED (TaskCancelled).")
        running = queryset.filter(status=TaskResultStatus.RUNNING)
        asked = control.request_cancel(running, using=queryset.db)
        self._log(request, asked, "Cancellation requested of a RUNNING task.")
        selected = queryset.count()
        if done or not asked:
            self.message_user(request, f"{len(done)} task(s) cancelled.", messages.SUCCESS)
        stopping = [record for record in asked if runs_async(record.task_path)]
        if stopping:
            self.message_user(
                request,
                f"{len(stopping)} running async task(s) will be cancelled at their worker's next "
                "heartbeat.",
                messages.SUCCESS,
            )
        if len(asked) > len(stopping):
            self.message_user(
                request,
                f"{len(asked) - len(stopping)} running sync task(s) cannot be interrupted: they "
                "run to their end (a task prefetched but not started yet is cancelled at its "
                "worker's next heartbeat).",
                messages.WARNING,
            )
        if selected > len(done) + len(asked):
            self.message_user(
                request,
                f"{selected - len(done) - len(asked)} task(s) skipped: they had finished.",
                messages.WARNING,
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
        if bulk.across(request):
            return bulk.confirm_or_queue(self, request, queryset, kind=store_bulk.DELETE)
        # Django's confirmation page, logging and deletion, limited to finished tasks.
        return django_delete_selected(self, request, queryset.filter(status__in=FINISHED_STATUSES))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> None:
        finished = queryset.filter(status__in=FINISHED_STATUSES)
        ids = list(finished.values_list("pk", flat=True))
        finished.filter(pk__in=ids).delete()
        steps.forget(queryset.db, ids)

    def delete_model(self, request: HttpRequest, obj: TaskRecord) -> None:
        super().delete_model(request, obj)
        steps.forget(obj._state.db or "default", [obj.pk])

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
            path(
                "<path:object_id>/end_wait/",
                view(require_POST(self.end_wait_view)),
                name=f"{name}_end_wait",
            ),
            path(
                "<path:object_id>/send_event/",
                view(self.send_event_view),
                name=f"{name}_send_event",
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

    def end_wait_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not self.has_run_permission(request):
            raise PermissionDenied
        task = self._one(request, object_id).get()
        if durable.end(request, self, task):
            self._log(request, [task], "Ended its sleep or wait.")
        return self._back_to(object_id)

    def send_event_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """A form for the payload of the event a task waits for; posted, it sends it."""
        if not self.has_run_permission(request):
            raise PermissionDenied
        task = self._one(request, object_id).get()
        record = durable.waiting_record(task, task._state.db or "default")
        form = durable.SendEventForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            if durable.send(request, self, task, form.cleaned_data["payload"]):
                self._log(request, [task], "Sent the event it waited for.")
            return self._back_to(object_id)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "original": task,
            "waiting": record,
            "form": form,
            "title": _("Send the event"),
            "breadcrumbs_list": BREADCRUMBS_LIST,
        }
        return TemplateResponse(
            request, "admin/django_sqltasks/taskrecord/send_event.html", context
        )

    def _one(self, request: HttpRequest, object_id: str) -> QuerySet[TaskRecord]:
        try:
            task_id = uuid.UUID(object_id)
        except ValueError as e:  # not a task id: no such task, rather than a server error
            raise Http404(f"No task has the id {object_id!r}.") from e
        record = self.get_object(request, str(task_id))
        if record is None:
            raise Http404(f"No task has the id {object_id!r}.")
        return self.get_queryset(request).filter(pk=record.pk)

    def _back_to(self, object_id: str) -> HttpResponse:
        return HttpResponseRedirect(
            reverse("admin:django_sqltasks_taskrecord_change", args=[object_id])
        )


def retryable(tasks: QuerySet[TaskRecord]) -> QuerySet[TaskRecord]:
    """The FAILED tasks of ``tasks`` that a retry can run: not a workflow step that never ran,
    which was written without the arguments the steps before it hand on."""
    return store_bulk.eligible(store_bulk.RETRY, tasks)  # type: ignore[arg-type]


def runs_async(task_path: str) -> bool:
    """Whether the stored path names an ``async def`` task (False if it no longer resolves)."""
    try:
        task = resolve_task(task_path)
    except TaskNotFound:
        return False
    return iscoroutinefunction(task.func)
