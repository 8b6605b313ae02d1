"""How a task's progress report reads in the admin: a bar, its percentage and note in the
list's status column, and the whole report (metadata included) on the task's page."""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html

from ..core.progress import ProgressReport, current_report
from .display import cut_html, moment_html, pretty

BAR_STYLE = (
    "display:block;height:4px;margin-top:3px;border-radius:2px;background:#e5e7eb;"
    "max-width:8em;overflow:hidden"
)


def report_of(record: Any) -> ProgressReport | None:
    """The report of the record's latest attempt, if it made one."""
    return current_report(record.progress, len(record.worker_ids or ()))


def bar_html(progress: float) -> str:
    return format_html(
        '<span class="sqltasks-progress" style="{}" title="{}%">'
        '<span style="display:block;height:100%;width:{}%;background:#d97706"></span></span>',
        BAR_STYLE,
        f"{progress * 100:.0f}",
        f"{progress * 100:.1f}",
    )


def progress_list_html(record: Any) -> str:
    """Under a task's status in the list: its attempt's progress bar, percentage and note."""
    if record.status == "SUCCESSFUL":
        return ""
    report = report_of(record)
    if report is None or (report.progress is None and not report.note):
        return ""
    percent = "" if report.progress is None else f"{report.progress * 100:.0f}% "
    text = f"{percent}{report.note}".strip()
    bar = "" if report.progress is None else bar_html(report.progress)
    return format_html("{}{}", bar, cut_html(text))  # bar: safe HTML from format_html


def progress_detail_html(record: Any) -> str:
    """The report on a task's page: bar, percentage, note, attempt and when it was written."""
    report = report_of(record)
    if report is None:
        return "—"
    percent = "—" if report.progress is None else f"{report.progress * 100:.1f}%"
    bar = "" if report.progress is None else bar_html(report.progress)
    return format_html(
        "<div><strong>{}</strong> {}</div>{}<div>attempt {}, reported {}</div>",
        percent,
        report.note,
        bar,
        report.attempt,
        moment_html(report.updated_at),
    )


def metadata_html(record: Any) -> str:
    report = report_of(record)
    if report is None or not report.metadata:
        return "—"
    return pretty(dict(report.metadata))
