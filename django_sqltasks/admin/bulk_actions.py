"""Actions on every task matching the list's filters and search ("Select all", then an action):
a confirmation page with the count first, then the action in batches (``store/batches.py``),
logged once. A part of the task list (``admin/tasks.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext_lazy as _

from ..models import TaskRecord
from ..store.batches import in_batches
from .lists import EstimatedCountPaginator

CONFIRMED = "sqltasks_confirmed"  # the confirmation page's field: run it


def across(request: HttpRequest) -> bool:
    """Whether an action was asked for every matching task, not the ticked ones."""
    return request.POST.get("select_across") == "1"


def confirm_or_run(
    model_admin: Any,
    request: HttpRequest,
    queryset: QuerySet[TaskRecord],
    *,
    verb: str,
    action: Callable[[QuerySet[TaskRecord]], int],
) -> TemplateResponse | None:
    """Show the confirmation page of ``verb`` on every task of ``queryset``; once confirmed,
    run ``action`` on each batch (it returns how many of the batch it changed) and report."""
    if request.POST.get(CONFIRMED) != "yes":
        paginator = EstimatedCountPaginator(queryset, 1)
        context = {
            **model_admin.admin_site.each_context(request),
            "title": _("Are you sure?"),
            "opts": model_admin.model._meta,
            "verb": verb,
            "count_label": paginator.count_label,
            "action_name": request.POST.get("action", ""),
            "index": request.POST.get("index", "0"),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "confirmed": CONFIRMED,
            "form_url": request.get_full_path(),
        }
        return TemplateResponse(
            request, "admin/django_sqltasks/taskrecord/bulk_confirmation.html", context
        )
    done = batches = 0
    for batch in in_batches(queryset):  # type: ignore[arg-type]
        done += action(batch)
        batches += 1
    message = f"{done} task(s) {verb} of every task matching the list ({batches} batch(es))."
    LogEntry.objects.create(
        user_id=request.user.pk,  # type: ignore[misc]
        content_type=ContentType.objects.get_for_model(TaskRecord),
        object_repr=f"{verb}: {done} task(s)"[:200],
        action_flag=CHANGE,
        change_message=f"{message} Filters: {request.get_full_path()}",
    )
    model_admin.message_user(request, message, messages.SUCCESS)
    return None
