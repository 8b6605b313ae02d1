"""The admin's queue limits: each limited queue's limits in force and where they come from
(``OPTIONS["QUEUE_LIMITS"]`` or an override), and the overrides an operator sets, changes and
deletes (which puts the settings' limits back) at run time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext_lazy as _

from ..core.backends import sql_backends
from ..core.limits import Limit, overridden, parse_override, rate_text
from ..exceptions import UnknownQueue
from ..models import QueueLimitOverride
from ..store.flow import check_queue
from ..store.queue_limits import OVERRIDE, QueueLimitState, states
from .lists import NulSafeAdmin, WritesLocked

if TYPE_CHECKING:
    OverrideAdminBase = admin.ModelAdmin[QueueLimitOverride]
    OverrideFormBase = forms.ModelForm[QueueLimitOverride]
else:
    OverrideAdminBase = admin.ModelAdmin
    OverrideFormBase = forms.ModelForm


class QueueLimitForm(OverrideFormBase):
    """An override: limits as an operator types them, checked as ``tasks_queue limit`` does."""

    # Not the model's own names: the model's fields hold the parsed values, these the text.
    concurrency_limit = forms.CharField(
        label=_("concurrency limit"),
        required=False,
        help_text=_(
            "At most this many of the queue's tasks RUNNING across every worker (at least 1: "
            "to stop the queue, pause it). Blank: the settings' limit."
        ),
    )
    rate_limit = forms.CharField(
        label=_("rate limit"),
        required=False,
        help_text=_("At most this many starts: '10/s', '100/m' or '1000/h'. Blank: the settings'."),
    )

    class Meta:
        model = QueueLimitOverride
        fields = ("backend_name", "queue_name")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "backend_name" in self.fields:
            aliases = sorted(sql_backends())
            self.fields["backend_name"] = forms.ChoiceField(
                label=_("backend"), choices=[(a, a) for a in aliases]
            )
        if self.instance.pk is not None:
            limit = self.instance.limit
            self.initial["concurrency_limit"] = limit.concurrency
            self.initial["rate_limit"] = rate_text(limit)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        alias = data.get("backend_name", self.instance.backend_name)
        queue = data.get("queue_name", self.instance.queue_name)
        backend = sql_backends().get(alias)
        if backend is not None and "queue_name" in self.fields and queue:
            try:
                check_queue(alias, backend.queues, queue)
            except UnknownQueue as e:
                self.add_error("queue_name", str(e))
        values = {
            f: (data.get(f) or "").strip() or None for f in ("concurrency_limit", "rate_limit")
        }
        if values["concurrency_limit"] is None and values["rate_limit"] is None:
            raise forms.ValidationError(
                _(
                    "Give a concurrency limit, a rate limit or both: an override sets a limit "
                    "(delete the override to go back to the settings' limits)."
                )
            )
        for field, value in values.items():
            if value is None:
                continue
            args = (value, None) if field == "concurrency_limit" else (None, value)
            try:
                parse_override(*args, fields=("concurrency", "rate"))
            except ValueError as e:
                self.add_error(field, str(e))
        data.update(values)
        return data


@admin.register(QueueLimitOverride)
class QueueLimitOverrideAdmin(WritesLocked, NulSafeAdmin, OverrideAdminBase):
    """The overrides, each with the limits in force; above them, every limited queue's."""

    form = QueueLimitForm
    list_display = (
        "queue_name",
        "backend_name",
        "concurrency_in_force",
        "rate_in_force",
        "updated_at",
    )
    list_filter = ("backend_name",)
    search_fields = ("queue_name",)
    fields = ("backend_name", "queue_name", "concurrency_limit", "rate_limit", "updated_at")
    change_list_template = "admin/django_sqltasks/queuelimitoverride/change_list.html"

    def get_readonly_fields(
        self, request: HttpRequest, obj: QueueLimitOverride | None = None
    ) -> tuple[str, ...]:
        # An override is of one queue: another queue's is another row.
        return ("backend_name", "queue_name", "updated_at") if obj else ("updated_at",)

    @admin.display(description=_("concurrency in force"))
    def concurrency_in_force(self, obj: QueueLimitOverride) -> str:
        state = self._state(obj)
        value = state.in_force.concurrency
        return describe(value, state.concurrency_source, state.settings.concurrency)

    @admin.display(description=_("rate in force"))
    def rate_in_force(self, obj: QueueLimitOverride) -> str:
        state = self._state(obj)
        value = rate_text(state.in_force)
        return describe(value, state.rate_source, rate_text(state.settings))

    @staticmethod
    def _state(obj: QueueLimitOverride) -> QueueLimitState:
        backend = sql_backends().get(obj.backend_name)
        settings = backend.config.queue_limits if backend is not None else {}
        return QueueLimitState(obj.queue_name, settings.get(obj.queue_name, Limit()), obj.limit)

    def save_model(
        self, request: HttpRequest, obj: QueueLimitOverride, form: Any, change: bool
    ) -> None:
        # Through the backend: it wakes the workers of a database that can (PostgreSQL).
        data = form.cleaned_data
        concurrency = data["concurrency_limit"]
        backend = sql_backends()[obj.backend_name]
        backend.set_queue_limit(
            obj.queue_name,
            concurrency=None if concurrency is None else int(concurrency),
            rate=data["rate_limit"],
        )
        saved = QueueLimitOverride.objects.get(
            backend_name=obj.backend_name, queue_name=obj.queue_name
        )
        obj.pk, obj.updated_at = saved.pk, saved.updated_at
        limit = saved.limit
        obj.concurrency, obj.rate, obj.period = limit.concurrency, limit.rate, limit.period

    def delete_model(self, request: HttpRequest, obj: QueueLimitOverride) -> None:
        clear(obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[QueueLimitOverride]) -> None:
        for obj in queryset:
            clear(obj)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # As the task list: at 1280 px the app navigation would push columns out of sight.
        context = {
            "is_nav_sidebar_enabled": False,
            "limited_queues": in_force_rows(),
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)


def clear(obj: QueueLimitOverride) -> None:
    """Delete ``obj`` through its backend (which wakes the workers), or as a row if the backend
    is no longer configured."""
    backend = sql_backends().get(obj.backend_name)
    if backend is None:
        obj.delete()
    else:
        backend.clear_queue_limit(obj.queue_name)


def describe(value: object, source: str | None, settings_value: object) -> str:
    """A limit in force with its source: ``"3 (override; settings: 5)"``, ``"5 (settings)"``."""
    if value is None:
        return "-"
    if source == OVERRIDE:
        was = "none" if settings_value is None else settings_value
        return f"{value} ({OVERRIDE}; settings: {was})"
    return f"{value} ({source})"


def in_force_rows() -> list[dict[str, Any]]:
    """Every limited queue of every backend, for the table above the overrides."""
    rows = []
    for alias, backend in sorted(sql_backends().items()):
        for state in states(backend.database, alias, backend.config.queue_limits):
            force = overridden(state.settings, state.override)
            rows.append(
                {
                    "backend": alias,
                    "queue": state.queue,
                    "concurrency": describe(
                        force.concurrency, state.concurrency_source, state.settings.concurrency
                    ),
                    "rate": describe(
                        rate_text(force), state.rate_source, rate_text(state.settings)
                    ),
                    "overridden": state.override is not None,
                }
            )
    return rows
