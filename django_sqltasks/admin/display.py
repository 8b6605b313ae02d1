"""How a task reads in the admin: status badges, an error's summary, times, JSON values."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from urllib.parse import quote

import django
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from ..core import error_text

# Django 6.1 styles breadcrumbs as <ol class="breadcrumbs">; earlier versions as a <div>.
BREADCRUMBS_LIST = django.VERSION >= (6, 1)
STATUS_COLOURS = {
    "READY": "#2563eb",
    "RUNNING": "#d97706",
    "SUCCESSFUL": "#16a34a",
    "FAILED": "#dc2626",
}
PARKED_YEAR = 9999  # of sql.rows.PARKED: a workflow step waiting for the steps before it
SUMMARY_CHARACTERS = 80  # of an error's summary in the list; the full line is its tooltip


def pretty(value: Any) -> str:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, ensure_ascii=False))


def status_badge_html(status: str, label: str) -> str:
    return format_html(
        '<span class="sqltasks-status" data-status="{}" style="background:{};color:#fff;'
        "padding:2px 8px;border-radius:10px;font-size:11px;font-weight:600;"
        'white-space:nowrap">{}</span>',
        status,
        STATUS_COLOURS.get(status, "#6b7280"),
        label,
    )


def error_summary_html(stored: Any) -> str:
    """The last error as ``Class: first line of the message``, cut to fit a list column."""
    errors = error_text.stored_errors(stored)
    if not errors:
        return "—"
    text = error_text.summary(errors[-1])
    shown = text if len(text) <= SUMMARY_CHARACTERS else text[: SUMMARY_CHARACTERS - 1] + "…"
    return cut_html(shown, text, "sqltasks-error-summary")


def cut_html(text: str, title: str | None = None, css_class: str = "sqltasks-cut") -> str:
    """``text`` on one line, cut by the list's CSS where too wide; ``title`` whole on hover."""
    return format_html('<span class="{}" title="{}">{}</span>', css_class, title or text, text)


def moment_html(value: datetime | None) -> str:
    """A time as short as a list column allows: ``14:05:09`` today, ``Mar 01 14:05:09`` this year,
    ``2025-03-01`` before; the full time is its tooltip."""
    if value is None:
        return "—"
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    today = timezone.localtime() if timezone.is_aware(value) else datetime.now()
    if local.date() == today.date():
        short = local.strftime("%H:%M:%S")
    elif local.year == today.year:
        short = local.strftime("%b %d %H:%M:%S")
    else:
        short = local.strftime("%Y-%m-%d")
    return format_html(
        '<time datetime="{}" title="{}" style="white-space:nowrap">{}</time>',
        value.isoformat(),
        local.strftime("%Y-%m-%d %H:%M:%S %Z"),
        short,
    )


def full_time_html(value: datetime | None, parked: str = "") -> str:
    """A time on a task's page, to the second, in the current time zone; ``parked`` stands for
    the far-future time a workflow step waits at until the steps before it end."""
    if value is None:
        return "—"
    if value.year == PARKED_YEAR:
        return parked or "—"
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    return format_html(
        '<time datetime="{}">{}</time>', value.isoformat(), local.strftime("%Y-%m-%d %H:%M:%S %Z")
    )


def tags_html(tags: Any) -> str:
    """A task's tags as small labels, each linking to the list of tasks with that tag."""
    if not tags or not isinstance(tags, list):
        return "—"
    tasks = reverse("admin:django_sqltasks_taskrecord_changelist")
    return format_html_join(
        " ",
        '<a class="sqltasks-tag" href="{}?tag={}">{}</a>',
        ((tasks, quote(str(tag)), tag) for tag in tags),
    )


def attempts_html(runs: int, charged: int) -> str:
    """A task's attempts as its ``TaskResult.attempts`` counts them (``runs``, one per worker id
    it was run by), and, where it differs, how many count against ``max_attempts``."""
    if runs == charged:
        return str(runs)
    return format_html(
        '{} <span class="help" title="{}">({} against max_attempts)</span>',
        runs,
        _(
            "Runs that resumed a durable task after a sleep or a wait, or ran a snoozed task "
            "again, do not count against max_attempts."
        ),
        charged,
    )
