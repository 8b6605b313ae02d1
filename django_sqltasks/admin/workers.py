"""The admin's read-only worker records, with what each worker's claims cost over the last
minute; a live worker's row is kept."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.translation import gettext_lazy as _

from ..core.backends import sql_backends
from ..core.options import BackendOptions
from ..models import WorkerRecord
from ..ops.claims import describe, published
from ..store.control import database_now
from .display import moment_html
from .lists import NulSafeAdmin, WritesLocked

if TYPE_CHECKING:
    WorkerAdminBase = admin.ModelAdmin[WorkerRecord]
else:
    WorkerAdminBase = admin.ModelAdmin

LIVE_WORKER = (
    "Worker {id} is live (it heartbeat {ago} ago): its row is the lease on the tasks it runs, "
    "and without it another worker would rescue them and run them a second time while they "
    "still run. Stop the worker (SIGTERM) instead; it removes its own row."
)


def live_workers(queryset: QuerySet[WorkerRecord]) -> QuerySet[WorkerRecord]:
    """The workers whose heartbeat is within their backend's LEASE_TIMEOUT, by the database's
    clock: heartbeats are written by it, and this machine's may be off by more than a lease."""
    now = database_now(queryset.db)
    backends = sql_backends()
    default = timedelta(seconds=BackendOptions().lease_timeout)
    live = Q(heartbeat_at__gte=now - default) & ~Q(backend_name__in=list(backends))
    for alias, backend in backends.items():
        lease = timedelta(seconds=backend.config.lease_timeout)
        live |= Q(backend_name=alias, heartbeat_at__gte=now - lease)
    return queryset.filter(live)


def is_live(worker: WorkerRecord) -> bool:
    return live_workers(WorkerRecord.objects.using(worker._state.db).filter(pk=worker.pk)).exists()


@admin.register(WorkerRecord)
class WorkerRecordAdmin(WritesLocked, NulSafeAdmin, WorkerAdminBase):
    list_display = (
        "id",
        "hostname",
        "pid",
        "backend_name",
        "concurrency",
        "started_display",
        "heartbeat_display",
        "claims_display",
    )
    ordering = ("-heartbeat_at",)
    actions = ("delete_selected",)
    readonly_fields = (
        "id",
        "hostname",
        "pid",
        "backend_name",
        "queue_names",
        "concurrency",
        "started_at",
        "heartbeat_at",
        "claims_display",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkerRecord]:
        # The database's time beside each row: a figure is fresh by its clock (ops/claims.py).
        return super().get_queryset(request).annotate(db_now=Now())

    @admin.display(description=_("started at"), ordering="started_at")
    def started_display(self, obj: WorkerRecord) -> str:
        return moment_html(obj.started_at)

    @admin.display(description=_("last heartbeat"), ordering="heartbeat_at")
    def heartbeat_display(self, obj: WorkerRecord) -> str:
        return moment_html(obj.heartbeat_at)

    @admin.display(description=_("claims (last minute)"))
    def claims_display(self, obj: WorkerRecord) -> str:
        now = getattr(obj, "db_now", None)
        return describe(None if now is None else published(obj, now))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and is_live(obj):
            return False
        return super().has_delete_permission(request, obj)

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        worker = self.get_object(request, object_id)
        if worker is not None and is_live(worker) and super().has_delete_permission(request):
            self.message_user(request, self._live_message(worker), messages.ERROR)
            url = reverse("admin:django_sqltasks_workerrecord_change", args=[worker.pk])
            return HttpResponseRedirect(url)
        return super().delete_view(request, object_id, extra_context)

    @admin.action(description=_("Delete selected stopped workers"), permissions=["delete"])
    def delete_selected(
        self, request: HttpRequest, queryset: QuerySet[WorkerRecord]
    ) -> HttpResponse | None:
        live = list(live_workers(queryset))
        for worker in live:
            self.message_user(request, self._live_message(worker), messages.WARNING)
        stopped = queryset.exclude(pk__in=[w.pk for w in live])
        if not stopped.exists():
            return None
        return django_delete_selected(self, request, stopped)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[WorkerRecord]) -> None:
        # Checked again at the deletion itself: a worker may have started in between.
        queryset.exclude(pk__in=live_workers(queryset).values("pk")).delete()

    def _live_message(self, worker: WorkerRecord) -> str:
        ago = database_now(worker._state.db or "default") - worker.heartbeat_at
        return LIVE_WORKER.format(id=worker.pk, ago=f"{max(0, int(ago.total_seconds()))}s")
