"""A row's tasks on its own admin page: ``SubjectTasksMixin`` for the ModelAdmin of any model
whose rows tasks are enqueued about (``task.using(subject=obj)``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..core.subject import subject_of
from ..models import TaskRecord

DEFAULT_LIMIT = 20  # tasks shown on the page, newest first; the rest are a link away


class SubjectTasksMixin:
    """Add a read-only "Tasks" field to the change page: the row's newest tasks, each linked
    to its page in the task admin, and a link to all of them.

    Without ``fields`` or ``fieldsets`` it shows below the form; with them, name
    ``"subject_tasks"`` where it should go. Only task names, states and times are shown here;
    the task admin's own permissions guard the rest.
    """

    subject_tasks_limit = DEFAULT_LIMIT

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> Any:
        fields = super().get_readonly_fields(request, obj)  # type: ignore[misc]
        if obj is None or "subject_tasks" in fields:
            return fields
        return (*fields, "subject_tasks")

    @admin.display(description=_("Tasks"))
    def subject_tasks(self, obj: Model) -> SafeString | str:
        if obj.pk is None:
            return "-"
        subject = subject_of(obj)
        records = list(
            TaskRecord.objects.for_subject(subject)
            .only("id", "task_path", "status", "enqueued_at", "finished_at")
            .order_by("-id")[: self.subject_tasks_limit + 1]
        )
        if not records:
            return gettext("No task was enqueued about this row.")
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    _task_link(r),
                    r.get_status_display(),
                    _time(r.enqueued_at),
                    _time(r.finished_at),
                )
                for r in records[: self.subject_tasks_limit]
            ),
        )
        table = format_html(
            "<table><thead><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            _("task"),
            _("status"),
            _("enqueued at"),
            _("finished at"),
            rows,
        )
        more = _all_link(subject.type, subject.id)
        if more is None:
            return table
        return format_html('{}<p><a href="{}">{}</a></p>', table, more, _("All tasks of this row"))


def _task_link(record: TaskRecord) -> SafeString | str:
    try:
        url = reverse("admin:django_sqltasks_taskrecord_change", args=[record.pk])
    except NoReverseMatch:  # the task admin is not on this site
        return record.task_path
    return format_html('<a href="{}">{}</a>', url, record.task_path)


def _all_link(subject_type: str, subject_id: str) -> str | None:
    try:
        url = reverse("admin:django_sqltasks_taskrecord_changelist")
    except NoReverseMatch:
        return None
    return f"{url}?{urlencode({'subject_type': subject_type, 'subject_id': subject_id})}"


def _time(value: Any) -> str:
    if value is None:
        return "-"
    if timezone.is_aware(value):
        value = timezone.localtime(value)
    return str(value.strftime("%Y-%m-%d %H:%M:%S"))
