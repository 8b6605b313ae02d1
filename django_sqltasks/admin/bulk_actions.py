"""Actions on every task matching the list's filters and search ("Select all", then an action):
a confirmation page stating how many tasks the action will change, then a job that changes
them on a worker (``bulk_jobs.py``), linked from the message the list shows at once. A part of
the task list (``admin/tasks.py``)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from ..models import TaskRecord
from ..store import bulk
from . import bulk_jobs
from .display import BREADCRUMBS_LIST
from .lists import id_floor

CONFIRMED = "sqltasks_confirmed"  # the confirmation page's field: run it
STATED = "sqltasks_stated"  # how many tasks the page said would change ("" for more than)
BELOW = "sqltasks_below"  # the id the page counted below: newer tasks are left out
EXACT_UP_TO = 100_000  # tasks counted exactly on the confirmation page; more: "more than N"


def across(request: HttpRequest) -> bool:
    """Whether an action was asked for every matching task, not the ticked ones."""
    return request.POST.get("select_across") == "1"


def confirm_or_queue(
    model_admin: Any, request: HttpRequest, queryset: QuerySet[TaskRecord], *, kind: str
) -> TemplateResponse | None:
    """Show the confirmation page of change ``kind`` on every task of ``queryset`` it applies
    to, with their count; once confirmed, queue the job that makes it, and say so."""
    verb = bulk_jobs.VERBS[kind]
    if request.POST.get(CONFIRMED) != "yes":
        # Tasks enqueued after this page are left out: the count stays what it says.
        below = id_floor(timezone.now() + timedelta(milliseconds=1))
        tasks = bulk.eligible(kind, queryset).filter(pk__lt=below)  # type: ignore[arg-type]
        count = tasks.order_by()[: EXACT_UP_TO + 1].count()
        exact = count <= EXACT_UP_TO
        context = {
            **model_admin.admin_site.each_context(request),
            "title": _("Are you sure?"),
            "opts": model_admin.model._meta,
            "verb": verb,
            "kind": kind,
            "count": count,
            "count_label": f"{count:,}" if exact else f"more than {EXACT_UP_TO:,}",
            "stated": count if exact else "",
            "below": below,
            "action_name": request.POST.get("action", ""),
            "index": request.POST.get("index", "0"),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "confirmed": CONFIRMED,
            "stated_name": STATED,
            "below_name": BELOW,
            "form_url": request.get_full_path(),
            "breadcrumbs_list": BREADCRUMBS_LIST,
        }
        return TemplateResponse(
            request, "admin/django_sqltasks/taskrecord/bulk_confirmation.html", context
        )
    try:
        stated, below = confirmed_scope(request)
        task = bulk_jobs.job_task(queryset.db)
    except (ValueError, bulk_jobs.JobUnavailable) as e:
        model_admin.message_user(request, str(e), messages.ERROR)
        return None
    token = uuid.uuid4().hex
    query = request.GET.urlencode()
    result = task.enqueue(
        kind,
        query,
        site=model_admin.admin_site.name,
        below=str(below),
        stated=stated,
        user=request.user.pk,
        size=bulk_jobs.BATCH_SIZE,
        token=token,
    )
    link = reverse(
        f"{model_admin.admin_site.name}:django_sqltasks_taskrecord_change", args=[result.id]
    )
    if result.kwargs.get("token") != token:  # the dedupe key is held: another job is live
        model_admin.message_user(
            request,
            format_html(
                'Nothing was {}: another action on every task of a list is under way (<a href="{}">'
                "its task</a>). Run this one again once it has ended.",
                verb,
                link,
            ),
            messages.ERROR,
        )
        return None
    scope = f"{stated:,}" if stated is not None else f"more than {EXACT_UP_TO:,}"
    message = (
        f"Queued: {scope} task(s) to be {verb} by a job on a worker, in batches of "
        f"{bulk_jobs.BATCH_SIZE:,}"
    )
    LogEntry.objects.create(
        user_id=request.user.pk,  # type: ignore[misc]
        content_type=ContentType.objects.get_for_model(TaskRecord),
        object_repr=f"{verb}: {scope} task(s) queued"[:200],
        action_flag=CHANGE,
        change_message=f"{message} (task {result.id}). Filters: ?{query}",
    )
    model_admin.message_user(
        request,
        format_html('{}: <a href="{}">its progress and outcome</a>.', message, link),
        messages.SUCCESS,
    )
    return None


def confirmed_scope(request: HttpRequest) -> tuple[int | None, uuid.UUID]:
    """The count and the id bound the confirmation page stated, from its form; raise
    ``ValueError`` naming the field and the rule if either is missing or malformed."""
    raw_stated, raw_below = request.POST.get(STATED), request.POST.get(BELOW, "")
    if raw_stated is None:
        raise ValueError(f"Field {STATED}: missing; confirm the action from its confirmation page.")
    stated = None
    if raw_stated != "":
        if not raw_stated.isdigit():
            raise ValueError(
                f"Field {STATED}: must be a whole number of tasks, not {raw_stated!r}."
            )
        stated = int(raw_stated)
    try:
        below = uuid.UUID(raw_below)
    except ValueError:
        raise ValueError(f"Field {BELOW}: must be a task id, not {raw_below!r}.") from None
    return stated, below
