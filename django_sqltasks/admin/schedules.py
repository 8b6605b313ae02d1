"""The admin's periodic tasks: schedules made here, and those of settings' PERIODIC (synced in
by the workers), with a preview of their next runs.

A change holds from the workers' next scheduler tick: they read the table at each one. The
page writes only the fields it changed (with ``revision`` moved on), never the whole row, so a
save cannot put back a ``last_slot`` a worker advanced meanwhile.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.core.exceptions import PermissionDenied
from django.db.models import F, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from ..core.backends import sql_backends
from ..core.schedules import ScheduleError, check_cron, check_every, check_time_zone
from ..models import ScheduleRecord
from ..store.control import database_now
from ..store.schedules import TIMING, backend_time_zone, schedule_of
from .display import moment_html
from .lists import NulSafeAdmin, SQLBackendFilter, WritesLocked
from .schedule_form import DEFINITION, EDITABLE, ScheduleForm

if TYPE_CHECKING:
    ScheduleAdminBase = admin.ModelAdmin[ScheduleRecord]
else:
    ScheduleAdminBase = admin.ModelAdmin

PREVIEW_RUNS = 5
SETTINGS_KEPT = (
    "{count} periodic task(s) from OPTIONS['PERIODIC'] were not deleted: a worker would add them "
    "back when it starts. Remove them from the settings (they are then disabled here, and can be "
    "deleted), or disable them."
)


def next_runs(
    obj: ScheduleRecord, count: int = PREVIEW_RUNS, at: str | None = None
) -> list[datetime]:
    """The next ``count`` runs of a stored schedule (named ``at`` in its errors), by the
    database's clock."""
    backend = sql_backends().get(obj.backend_name)
    zone = backend_time_zone(backend) if backend is not None else "UTC"
    schedule = schedule_of(obj, zone, at)
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
class ScheduleRecordAdmin(WritesLocked, NulSafeAdmin, ScheduleAdminBase):
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
        # Each field by the name the form gives it; the schedule, unnamed yet, as "This schedule".
        for label, value, check in (
            ("cron", row.cron, check_cron),
            ("time_zone", row.time_zone, check_time_zone),
            ("every", every, check_every),
        ):
            if value not in ("", None):
                try:
                    check(label, value)
                except ScheduleError as e:
                    return HttpResponse(_error_html(f"This schedule cannot run: {_short_error(e)}"))
        return HttpResponse(self._runs_html(row, at=str(_("This schedule"))))

    def _runs_html(self, obj: ScheduleRecord, at: str | None = None) -> str:
        try:
            runs = next_runs(obj, at=at)
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
