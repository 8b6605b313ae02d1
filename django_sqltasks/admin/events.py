"""The admin's read-only list of durable tasks' events (``EventRecord``): sent, awaited, or
both. An unclaimed one (sent for a key no task waits for) may be deleted; one a task waits for
or took may not, as its row is where the task's wait and the send meet."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from ..models import EventRecord
from .display import moment_html
from .lists import NulSafeAdmin, WritesLocked

if TYPE_CHECKING:
    EventAdminBase = admin.ModelAdmin[EventRecord]
    StateFilterBase = admin.SimpleListFilter
else:
    EventAdminBase = admin.ModelAdmin
    StateFilterBase = admin.SimpleListFilter

# Sent, and no task waits for it: what PRUNE_UNCLAIMED_EVENT_DAYS deletes (the rows of
# sqltasks_event_unclaimed_idx).
UNCLAIMED = Q(task_id__isnull=True, sent_at__isnull=False)
STATES = {
    "unclaimed": UNCLAIMED,
    "waiting": Q(task_id__isnull=False, sent_at__isnull=True),
    "received": Q(task_id__isnull=False, sent_at__isnull=False),
}


class EventStateFilter(StateFilterBase):
    """Events by what became of them."""

    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("unclaimed", _("sent, no task waits for it")),
            ("waiting", _("awaited, not sent yet")),
            ("received", _("sent and taken by its task")),
        ]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[EventRecord]
    ) -> QuerySet[EventRecord]:
        value = self.value()
        if value is None:
            return queryset
        if value not in STATES:
            return queryset.none()
        return queryset.filter(STATES[value])


@admin.register(EventRecord)
class EventRecordAdmin(WritesLocked, NulSafeAdmin, EventAdminBase):
    list_display = ("name", "key", "state_display", "sent_display", "task_display")
    list_filter = (EventStateFilter,)
    ordering = ("-id",)
    actions = ("delete_selected",)
    show_full_result_count = False  # no count of the whole table
    readonly_fields = ("name", "key", "payload", "created_at", "sent_at", "task_id")

    @admin.display(description=_("state"))
    def state_display(self, obj: EventRecord) -> str:
        if obj.task_id is None:
            return str(_("sent, no task waits for it"))
        if obj.sent_at is None:
            return str(_("awaited, not sent yet"))
        return str(_("sent and taken by its task"))

    @admin.display(description=_("sent at"), ordering="sent_at")
    def sent_display(self, obj: EventRecord) -> str:
        return moment_html(obj.sent_at)

    @admin.display(description=_("task"))
    def task_display(self, obj: EventRecord) -> str:
        if obj.task_id is None:
            return "-"
        url = reverse("admin:django_sqltasks_taskrecord_change", args=[obj.task_id])
        return format_html('<a href="{}">{}</a>', url, obj.task_id)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.task_id is not None:
            return False  # its waiter would miss the event sent next
        return super().has_delete_permission(request, obj)

    @admin.action(description=_("Delete selected unclaimed events"), permissions=["delete"])
    def delete_selected(
        self, request: HttpRequest, queryset: QuerySet[EventRecord]
    ) -> HttpResponse | None:
        kept = queryset.exclude(UNCLAIMED).count()
        if kept:
            self.message_user(
                request,
                _(
                    "%(n)d selected event(s) are awaited or taken by a task and were kept: "
                    "their row is where the wait and the send meet."
                )
                % {"n": kept},
                messages.WARNING,
            )
        unclaimed = queryset.filter(UNCLAIMED)
        if not unclaimed.exists():
            return None
        return django_delete_selected(self, request, unclaimed)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[EventRecord]) -> None:
        # Unclaimed ones only, checked at the deletion itself: a task may wait for one now.
        queryset.filter(UNCLAIMED).delete()

    def delete_model(self, request: HttpRequest, obj: EventRecord) -> None:
        EventRecord.objects.using(obj._state.db).filter(UNCLAIMED, pk=obj.pk).delete()
