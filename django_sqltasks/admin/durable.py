"""Durable tasks on their pages in the admin: the steps a task recorded, what a stopped task
waits for and until when, the filter of waiting tasks, and what an operator does to a waiting
task (send its event, end its wait). A part of the task page (``admin/tasks.py``)."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..core.backends import backend_config
from ..exceptions import InvalidStep, PayloadTooLarge
from ..models import StepRecord, TaskRecord
from ..store import events
from .display import full_time_html, pretty

ERROR_LINES = 12  # of a step's error shown; the rest is on the task's own errors


class WaitingFilter(admin.SimpleListFilter):
    """Tasks stopped at a sleep or a wait for an event (READY, holding no worker)."""

    title = gettext_lazy("waiting")
    parameter_name = "waiting"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("any", gettext_lazy("sleeping or waiting for an event")),
            ("sleep", gettext_lazy("sleeping")),
            ("event", gettext_lazy("waiting for an event")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value not in ("any", "sleep", "event"):
            return queryset
        waiting = StepRecord.objects.using(queryset.db).filter(state=StepRecord.WAITING)
        if value != "any":
            waiting = waiting.filter(kind=value)
        return queryset.filter(pk__in=waiting.values("task_id"), status="READY")


def steps_html(task: TaskRecord, using: str) -> str:
    """The steps, sleeps and waits ``task`` recorded, as a table (``—`` if none)."""
    records = events.steps_of(using, task.pk)
    if not records:
        return "—"
    head = format_html(
        "<tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr>",
        _("step"),
        _("kind"),
        _("state"),
        _("attempts"),
        _("duration"),
        _("result or error"),
    )
    rows = format_html_join("", "{}", ((_step_row(record),) for record in records))
    return format_html('<table class="sqltasks-steps">{}{}</table>', head, rows)


def _step_row(record: StepRecord) -> str:
    name = record.name if record.occurrence == 0 else f"{record.name} #{record.occurrence + 1}"
    if record.kind == StepRecord.EVENT:
        name = f"{name} ({record.event_key})"
    duration = record.duration
    if duration is None:
        shown = "—"
    else:
        shown = f"{duration * 1000:.0f} ms" if duration < 1 else f"{duration:.1f} s"
    outcome: str
    if record.state == StepRecord.FAILED:
        lines = record.error.splitlines()
        outcome = format_html("<pre>{}</pre>", "\n".join(lines[-ERROR_LINES:]))
    elif record.state == StepRecord.WAITING:
        outcome = _until_html(record)
    elif record.state == StepRecord.DONE and record.kind != StepRecord.SLEEP:
        outcome = pretty(record.result)
    else:
        outcome = "—"
    return format_html(
        '<tr data-state="{}"><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td>'
        "<td>{}</td><td>{}</td></tr>",
        record.state,
        name,
        record.get_kind_display(),
        record.get_state_display(),
        record.attempts,
        shown,
        outcome,
    )


def _until_html(record: StepRecord) -> str:
    if record.wake_at is None:
        return _("no timeout")
    return format_html("{} {}", _("until"), full_time_html(record.wake_at))


def waiting_html(task: TaskRecord, using: str) -> str:
    """What a stopped task waits for, and until when (``—`` if it waits for nothing)."""
    record = events.waiting_for(using, task.pk) if task.status == "READY" else None
    if record is None:
        return "—"
    if record.kind == StepRecord.SLEEP:
        return format_html("{} {}", _("Sleeping"), _until_html(record))
    return format_html(
        "{} <code>{}</code> {} <code>{}</code>, {}",
        _("Waiting for the event"),
        record.name,
        _("with the key"),
        record.event_key,
        _until_html(record),
    )


def waiting_record(task: TaskRecord | None, using: str) -> StepRecord | None:
    """The sleep or wait ``task`` is stopped at, if it is READY and stopped at one."""
    if task is None or task.status != "READY":
        return None
    return events.waiting_for(using, task.pk)


class SendEventForm(forms.Form):
    """The payload an operator sends to a waiting task, as JSON."""

    payload = forms.CharField(
        label=gettext_lazy("payload (JSON)"),
        widget=forms.Textarea(attrs={"rows": 6, "cols": 60}),
        initial="null",
        required=False,
    )

    def clean_payload(self) -> Any:
        text = self.cleaned_data["payload"].strip() or "null"
        try:
            return json.loads(text)
        except ValueError as e:
            raise forms.ValidationError(_("Not JSON: %(error)s"), params={"error": e}) from e


def send(request: HttpRequest, admin_: Any, task: TaskRecord, payload: Any) -> bool:
    """Send the event ``task`` waits for with ``payload``; report it to the operator."""
    using = task._state.db or "default"
    record = waiting_record(task, using)
    if record is None or record.kind != StepRecord.EVENT or record.event_key is None:
        admin_.message_user(request, _("The task does not wait for an event."), messages.WARNING)
        return False
    try:
        sent = events.send_event(record.name, record.event_key, payload, backend=task.backend_name)
    except (InvalidStep, PayloadTooLarge) as e:
        admin_.message_user(request, str(e), messages.ERROR)
        return False
    if sent:
        admin_.message_user(request, _("Event sent: the task runs on."), messages.SUCCESS)
    else:
        admin_.message_user(request, _("The event had been sent already."), messages.WARNING)
    return bool(sent)


def end(request: HttpRequest, admin_: Any, task: TaskRecord) -> bool:
    """End the sleep or wait ``task`` is stopped at; report it to the operator."""
    using = task._state.db or "default"
    config = backend_config(task.backend_name)
    notify = True if config is None else config.notify
    if events.end_wait(using, task.pk, notify=notify):
        admin_.message_user(
            request,
            _("Wait ended: the task runs on (a wait for an event gets EventTimeout)."),
            messages.SUCCESS,
        )
        return True
    admin_.message_user(request, _("The task is not sleeping or waiting."), messages.WARNING)
    return False
