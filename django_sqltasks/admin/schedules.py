"""The admin's periodic tasks: schedules made here, and those of settings' PERIODIC (synced in
by the workers), with a preview of their next runs.

A change holds from the workers' next scheduler tick: they read the table at each one. The
page writes only the fields it changed (with ``revision`` moved on), never the whole row, so a
save cannot put back a ``last_slot`` a worker advanced meanwhile.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.core.exceptions import PermissionDenied
from django.db.models import F, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from ..core.binding import check_binds
from ..core.resolve import resolve_task
from ..core.schedules import (
    ScheduleError,
    check_cron,
    check_every,
    check_priority,
    check_queue_name,
    check_task_path,
    check_time_zone,
    parse_schedule,
)
from ..core.serialization import check_arguments, dumps, text_problem
from ..core.settings import SQLBackend, sql_backends
from ..exceptions import UnknownQueue
from ..models import ScheduleRecord
from ..store.control import database_now
from ..store.flow import check_queue
from ..store.schedules import TIMING, backend_time_zone, entry_of, schedule_of
from .display import moment_html
from .lists import NulSafeAdmin, SQLBackendFilter

if TYPE_CHECKING:
    ScheduleAdminBase = admin.ModelAdmin[ScheduleRecord]
    ScheduleFormBase = forms.ModelForm[ScheduleRecord]
else:
    ScheduleAdminBase = admin.ModelAdmin
    ScheduleFormBase = forms.ModelForm

# The fields the page edits; of a schedule from settings, only ``enabled``.
DEFINITION = (
    "task_path",
    "args",
    "kwargs",
    "cron",
    "time_zone",
    "every",
    "queue_name",
    "priority",
)
EDITABLE = ("backend_name", "name", "enabled", *DEFINITION)
PREVIEW_RUNS = 5
SETTINGS_KEPT = (
    "{count} periodic task(s) from OPTIONS['PERIODIC'] were not deleted: a worker would add them "
    "back when it starts. Remove them from the settings (they are then disabled here, and can be "
    "deleted), or disable them."
)
THIS = "This field"  # the start of Django's own field errors ("This field is required.")


class JSONText(forms.CharField):
    """JSON typed in a text area: shown as JSON, read back as data. Unlike Django's
    ``forms.JSONField``, a document nested past Python's recursion limit is a form error,
    not a 500."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 60, "class": "vLargeTextField"})

    def __init__(self, *, kind: type, **kwargs: Any) -> None:
        self.kind = kind
        super().__init__(strip=True, required=False, **kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, str):
            return value
        return json.dumps(self.kind() if value is None else value, ensure_ascii=False)

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if not text:
            return self.kind()
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as e:
            # ValueError: not JSON, or an integer of more digits than Python reads.
            raise forms.ValidationError(
                _("Enter valid JSON (%(kind)s): %(error)s"),
                params={"kind": "a list" if self.kind is list else "an object", "error": e},
            ) from e
        if not isinstance(data, self.kind):
            raise forms.ValidationError(
                _("Enter a JSON %(kind)s, such as %(example)s."),
                params={
                    "kind": "list" if self.kind is list else "object",
                    "example": '[1, "a"]' if self.kind is list else '{"name": "value"}',
                },
            )
        return data

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return self.to_python(data) != (self.kind() if initial is None else initial)
        except forms.ValidationError:
            return True


class ScheduleForm(ScheduleFormBase):
    """The checks of a PERIODIC entry, each error on its field; then the task is imported
    (within the trust boundary the workers keep) and the arguments bound to its function."""

    backend_name = forms.ChoiceField(label=_("Backend"))
    args = JSONText(
        kind=list, label=_("Arguments (args)"), help_text=_('A JSON list, such as [1, "a"].')
    )
    kwargs = JSONText(
        kind=dict,
        label=_("Keyword arguments (kwargs)"),
        help_text=_('A JSON object, such as {"base": "EUR"}.'),
    )

    class Meta:
        model = ScheduleRecord
        fields = EDITABLE
        help_texts = {
            "task_path": _("The dotted path of a @task function, such as reports.tasks.build."),
            "cron": _(
                "A cron expression, such as 0 3 * * * (03:00 every day) or */15 * * * *. "
                "Give cron or every, not both."
            ),
            "time_zone": _(
                "For cron: the IANA zone its wall clock is read in, such as Europe/Paris. "
                "Blank: the backend's TIME_ZONE."
            ),
            "every": _("Seconds between runs, 1 to 31,622,400 (366 days), aligned to the epoch."),
            "queue_name": _("Blank: the task's own queue."),
            "priority": _("-100 to 100. Blank: the task's own priority."),
            "enabled": _("Takes effect at the workers' next scheduler tick."),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "backend_name" in self.fields:
            aliases = sorted(sql_backends())
            field = self.fields["backend_name"]
            assert isinstance(field, forms.ChoiceField)
            field.choices = [(a, a) for a in aliases]
            if len(aliases) == 1 and not self.instance.pk:
                field.initial = aliases[0]

    def _checked(self, name: str, check: Any) -> Any:
        value = self.cleaned_data.get(name)
        if value in (None, ""):
            return value
        try:
            return check(THIS, value)
        except ScheduleError as e:
            raise forms.ValidationError(str(e)) from e

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        problem = text_problem(name)
        if problem is not None:
            raise forms.ValidationError(f"{THIS} {problem}.")
        return name

    def clean_task_path(self) -> str:
        path: str = self._checked("task_path", check_task_path)
        return path

    def clean_cron(self) -> str:
        cron: str = self._checked("cron", check_cron)
        return cron.strip()

    def clean_time_zone(self) -> str:
        zone: str = self._checked("time_zone", check_time_zone)
        return zone

    def clean_every(self) -> float | None:
        every: float | None = self._checked("every", check_every)
        return every

    def clean_queue_name(self) -> str:
        queue: str = self._checked("queue_name", check_queue_name)
        return queue

    def clean_priority(self) -> int | None:
        priority: int | None = self._checked("priority", check_priority)
        return priority

    def clean_args(self) -> list[Any]:
        return self._arguments("args")

    def clean_kwargs(self) -> dict[str, Any]:
        return self._arguments("kwargs")

    def _arguments(self, name: str) -> Any:
        value = self.cleaned_data.get(name)
        try:
            if name == "args":
                check_arguments(value, {})
            else:
                check_arguments([], value)
        except TypeError as e:  # InvalidTaskArguments names the argument and the rule
            raise forms.ValidationError(str(e)) from e
        return value

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        backend = self._backend(data)
        if backend is None:
            return data
        # Of a schedule from settings, the form holds 'enabled' only: nothing else to check.
        if self.instance.pk is None or self.instance.origin == ScheduleRecord.ADMIN:
            self._check_timing(data)
            self._check_name(data, backend)
            if not self.errors:
                self._check_task(data, backend)
        return data

    def _backend(self, data: dict[str, Any]) -> SQLBackend | None:
        alias = data.get("backend_name") or self.instance.backend_name
        backend = sql_backends().get(alias)
        if backend is None:
            self.add_error(None, f"{alias!r} is not a django-sqltasks backend of TASKS.")
        return backend

    def _check_timing(self, data: dict[str, Any]) -> None:
        cron, every = data.get("cron"), data.get("every")
        if bool(cron) == (every is not None):
            message = _("Give a cron expression or an interval in seconds (every), not both.")
            if not cron:
                message = _("Give a cron expression or an interval in seconds (every).")
            self.add_error("cron", message)
        elif every is not None and data.get("time_zone"):
            self.add_error(
                "time_zone",
                _(
                    "A time zone applies to cron only: every counts seconds from the Unix "
                    "epoch, the same in every time zone. Leave it blank."
                ),
            )

    def _check_name(self, data: dict[str, Any], backend: SQLBackend) -> None:
        if data.get("name") in backend.config.periodic:
            self.add_error(
                "name",
                _(
                    "OPTIONS['PERIODIC'] of backend %(alias)s declares a schedule of this name; "
                    "it would replace this one when a worker starts. Choose another name."
                )
                % {"alias": backend.alias},
            )

    def _check_task(self, data: dict[str, Any], backend: SQLBackend) -> None:
        try:
            task = resolve_task(data["task_path"], backend=backend.alias)
        except Exception as e:  # TaskNotFound, TaskBackendMismatch: they say why
            self.add_error("task_path", str(e))
            return
        queue = data.get("queue_name")
        if queue:
            try:
                check_queue(backend.alias, backend.queues, queue)
            except UnknownQueue as e:
                self.add_error("queue_name", str(e))
                return
        args, kwargs = data.get("args") or [], data.get("kwargs") or {}
        try:
            check_binds(task, args, kwargs)
            task.using(queue_name=queue or None, priority=data.get("priority"))
        except Exception as e:  # InvalidTaskArguments, InvalidTask: they say why
            self.add_error("kwargs" if kwargs else "args", str(e))
            return
        limit = backend.config.max_payload_bytes
        size = len(dumps(args).encode()) + len(dumps(kwargs).encode())
        if limit is not None and size > limit:
            self.add_error(
                "args",
                f"The arguments take {size:,} bytes as JSON, over the backend's "
                f"MAX_PAYLOAD_BYTES ({limit:,}).",
            )
            return
        # The whole entry, as a worker reads it: nothing above should let a bad one through.
        row = ScheduleRecord(**{k: data.get(k) for k in DEFINITION})
        row.args, row.kwargs = args, kwargs
        try:
            parse_schedule(str(_("This schedule")), "", entry_of(row), backend_time_zone(backend))
        except ScheduleError as e:
            self.add_error(None, str(e))


def next_runs(obj: ScheduleRecord, count: int = PREVIEW_RUNS) -> list[datetime]:
    """The next ``count`` runs of a stored schedule, by the database's clock."""
    backend = sql_backends().get(obj.backend_name)
    zone = backend_time_zone(backend) if backend is not None else "UTC"
    schedule = schedule_of(obj, zone)
    database = obj._state.db or (backend.database if backend is not None else "default")
    moment = database_now(database)
    runs = []
    for _run in range(count):
        moment = schedule.next_slot(moment)
        runs.append(moment)
    return runs


def _zone_of(obj: ScheduleRecord) -> str:
    if not obj.cron:
        return "UTC"
    backend = sql_backends().get(obj.backend_name)
    return obj.time_zone or (backend_time_zone(backend) if backend is not None else "UTC")


@admin.register(ScheduleRecord)
class ScheduleRecordAdmin(NulSafeAdmin, ScheduleAdminBase):
    """Periodic tasks: made here, or from settings (where only ``enabled`` is edited here)."""

    form = ScheduleForm
    list_display = (
        "name",
        "enabled",
        "task_path",
        "timing",
        "origin_display",
        "last_run_display",
        "next_run_display",
        "backend_name",
    )
    list_filter = ("enabled", "origin", SQLBackendFilter)
    search_fields = ("name", "task_path")
    ordering = ("backend_name", "name")
    actions = ("enable_selected", "disable_selected", "delete_selected")
    fieldsets = (
        (None, {"fields": ("backend_name", "name", "enabled", "origin_note")}),
        (
            _("What it enqueues"),
            {"fields": ("task_path", "args", "kwargs", "queue_name", "priority")},
        ),
        (_("When"), {"fields": ("cron", "time_zone", "every", "preview")}),
        (
            _("Runs"),
            {"fields": ("last_run_display", "last_task", "last_error", "last_slot", "updated_at")},
        ),
    )
    RECORD = ("last_run_display", "last_task", "last_error", "last_slot", "updated_at")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        always = ("origin_note", "preview", *self.RECORD)
        if obj is None or obj.origin == ScheduleRecord.ADMIN:
            return always
        if obj.origin == ScheduleRecord.SETTINGS:
            return (*always, "backend_name", "name", *DEFINITION)
        return (*always, "backend_name", "name", "enabled", *DEFINITION)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.origin == ScheduleRecord.SETTINGS:
            return False  # a worker would add it back at its start
        return super().has_delete_permission(request, obj)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        obj = self.get_object(request, object_id)
        if obj is not None and obj.origin == ScheduleRecord.REMOVED and request.method == "GET":
            self.message_user(request, _removed_note(obj), messages.WARNING)
        return super().change_view(request, object_id, form_url, extra_context)

    def save_model(
        self, request: HttpRequest, obj: ScheduleRecord, form: Any, change: bool
    ) -> None:
        if not change:
            obj.origin = ScheduleRecord.ADMIN
            obj.last_slot = obj.next_run_at = None
            obj.updated_at = timezone.now()
            obj.save()
            return
        fields = [f for f in form.changed_data if f in EDITABLE]
        if not fields:
            return
        if set(fields) & set(TIMING) or ("enabled" in fields and obj.enabled):
            # A new timing, or a schedule enabled again, starts afresh: its first run is its
            # next slot, with no catch-up of a slot of the old timing or of the time it was off.
            obj.last_slot = obj.next_run_at = None
            fields += ["last_slot", "next_run_at"]
        obj.revision = F("revision") + 1
        obj.updated_at = timezone.now()
        obj.save(update_fields=[*fields, "revision", "updated_at"])
        obj.refresh_from_db(fields=["revision"])

    @admin.action(description=_("Delete selected periodic tasks"), permissions=["delete"])
    def delete_selected(
        self, request: HttpRequest, queryset: QuerySet[ScheduleRecord]
    ) -> HttpResponse | None:
        from_settings = queryset.filter(origin=ScheduleRecord.SETTINGS).count()
        if from_settings:
            self.message_user(request, SETTINGS_KEPT.format(count=from_settings), messages.WARNING)
        deletable = queryset.exclude(origin=ScheduleRecord.SETTINGS)
        if not deletable.exists():
            return None
        return django_delete_selected(self, request, deletable)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ScheduleRecord]) -> None:
        # Checked again at the deletion itself: a worker may have synced one in between.
        queryset.exclude(origin=ScheduleRecord.SETTINGS).delete()

    @admin.action(description=_("Enable selected periodic tasks"), permissions=["change"])
    def enable_selected(self, request: HttpRequest, queryset: QuerySet[ScheduleRecord]) -> None:
        removed = queryset.filter(origin=ScheduleRecord.REMOVED).count()
        changed = (
            queryset.filter(enabled=False)
            .exclude(origin=ScheduleRecord.REMOVED)
            .update(
                enabled=True,
                last_slot=None,
                next_run_at=None,
                revision=F("revision") + 1,
                updated_at=timezone.now(),
            )
        )
        self.message_user(request, f"Enabled {changed} periodic task(s).", messages.SUCCESS)
        if removed:
            self.message_user(
                request,
                f"{removed} periodic task(s) removed from settings were left disabled: put them "
                "back in OPTIONS['PERIODIC'] to run them again.",
                messages.WARNING,
            )

    @admin.action(description=_("Disable selected periodic tasks"), permissions=["change"])
    def disable_selected(self, request: HttpRequest, queryset: QuerySet[ScheduleRecord]) -> None:
        changed = queryset.filter(enabled=True).update(
            enabled=False, revision=F("revision") + 1, updated_at=timezone.now()
        )
        self.message_user(
            request,
            f"Disabled {changed} periodic task(s); the workers enqueue none from their next tick.",
            messages.SUCCESS,
        )

    # Columns and read-only fields --------------------------------------------------------

    @admin.display(description=_("when"))
    def timing(self, obj: ScheduleRecord) -> str:
        if obj.cron:
            return f"{obj.cron} ({_zone_of(obj)})"
        if obj.every is not None:
            return f"every {obj.every:g} s"
        return "-"

    @admin.display(description=_("origin"), ordering="origin")
    def origin_display(self, obj: ScheduleRecord) -> str:
        if obj.origin == ScheduleRecord.REMOVED:
            return format_html('<strong class="errornote">{}</strong>', _("removed from settings"))
        return str(obj.get_origin_display())

    @admin.display(description=_("origin"))
    def origin_note(self, obj: ScheduleRecord) -> str:
        if obj.pk is None or obj.origin == ScheduleRecord.ADMIN:
            return str(_("Made in the admin: every field can be changed here."))
        if obj.origin == ScheduleRecord.SETTINGS:
            return str(
                _(
                    "From OPTIONS['PERIODIC'] of backend %(alias)s: only 'enabled' is changed "
                    "here. Change the rest in the settings; each worker writes them here when it "
                    "starts."
                )
                % {"alias": obj.backend_name}
            )
        return _removed_note(obj)

    @admin.display(description=_("last run"), ordering="last_run_at")
    def last_run_display(self, obj: ScheduleRecord) -> str:
        return moment_html(obj.last_run_at) if obj.last_run_at else "-"

    @admin.display(description=_("next run"))
    def next_run_display(self, obj: ScheduleRecord) -> str:
        if not obj.enabled:
            return str(_("disabled"))
        try:
            return moment_html(next_runs(obj, 1)[0])
        except Exception as e:
            return format_html('<span class="errornote">{}</span>', _short_error(e))

    @admin.display(description=_("last task"))
    def last_task(self, obj: ScheduleRecord) -> str:
        if obj.last_task_id is None:
            return "-"
        url = reverse("admin:django_sqltasks_taskrecord_change", args=[obj.last_task_id])
        return format_html('<a href="{}">{}</a>', url, obj.last_task_id)

    @admin.display(description=_("next runs"))
    def preview(self, obj: ScheduleRecord) -> str:
        if obj.pk is None:
            return str(_("Give a cron expression or an interval to see the next runs."))
        return self._runs_html(obj)

    def get_urls(self) -> list[URLPattern]:
        opts = self.model._meta
        view = self.admin_site.admin_view(self.preview_view)
        name = f"{opts.app_label}_{opts.model_name}_preview"
        return [path("preview/", view, name=name), *super().get_urls()]

    def preview_view(self, request: HttpRequest) -> HttpResponse:
        """The next runs of the timing being typed in the form (the page asks as it changes)."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        given = request.GET
        every: float | None = None
        if given.get("every", "").strip():
            try:
                every = float(given["every"])
            except ValueError:
                return HttpResponse(_error_html("every must be a number of seconds."))
        row = ScheduleRecord(
            backend_name=given.get("backend_name", ""),
            task_path="preview.of_the_timing",  # not imported: only the timing is previewed
            cron=given.get("cron", "").strip(),
            time_zone=given.get("time_zone", "").strip(),
            every=every,
        )
        if not row.cron and every is None:
            return HttpResponse(self.preview(ScheduleRecord()))
        return HttpResponse(self._runs_html(row))

    def _runs_html(self, obj: ScheduleRecord) -> str:
        try:
            runs = next_runs(obj)
        except Exception as e:
            return _error_html(f"This schedule cannot run: {_short_error(e)}")
        zone = ZoneInfo(_zone_of(obj))
        items = format_html_join(
            "",
            '<li><time datetime="{}">{}</time> <span class="quiet">({} UTC)</span></li>',
            (
                (
                    run.isoformat(),
                    run.astimezone(zone).strftime(f"%a %Y-%m-%d %H:%M:%S {zone.key}"),
                    run.astimezone(ZoneInfo("UTC")).strftime("%H:%M:%S"),
                )
                for run in runs
            ),
        )
        note = "" if obj.enabled else str(_("Disabled: the runs it would make if enabled."))
        return format_html('<p>{}</p><ol class="sqltasks-next-runs">{}</ol>', note, items)


def _removed_note(obj: ScheduleRecord) -> str:
    return (
        f"Removed from OPTIONS['PERIODIC'] of backend {obj.backend_name!r} (a worker starting at "
        f"{obj.updated_at:%Y-%m-%d %H:%M:%S %Z} no longer found it): disabled, not deleted. "
        "Delete it here, or put it back in the settings to run it again."
    )


def _error_html(message: str) -> str:
    return format_html('<span class="errornote">{}</span>', message)


def _short_error(error: Exception) -> str:
    text = str(error)
    return text if len(text) <= 300 else f"{text[:297]}..."
