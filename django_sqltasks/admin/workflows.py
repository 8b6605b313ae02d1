"""A workflow on its tasks' pages in the admin: its steps in plan order, each with its state
and a link to its page, the one whose failure ended it marked."""

from __future__ import annotations

from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext as _

from ..core import workflow_plan as plan
from ..models import TaskRecord, WorkflowRecord
from .display import status_badge_html


def workflow_html(task: TaskRecord, using: str) -> str:
    """The workflow ``task`` is a step of, as HTML (``—`` if it is none's, or was deleted)."""
    if task.workflow_id is None:
        return "—"
    workflow = WorkflowRecord.objects.using(using).filter(pk=task.workflow_id).first()
    if workflow is None:
        return format_html("{} ({})", task.workflow_id, _("deleted"))
    ids = [leaf["id"] for leaf in plan.leaves(workflow.plan)]
    rows = TaskRecord.objects.using(using).filter(pk__in=ids).values_list("id", "status")
    statuses = {str(task_id): status for task_id, status in rows}
    failed = plan.failed_step(workflow.plan)
    header = format_html(
        "<p>{} {} · {} {}</p>",
        _("Workflow"),
        workflow.id,
        status_badge_html(workflow.status, workflow.get_status_display()),
        format_html("· {} <code>{}</code>", _("failed at"), failed["path"]) if failed else "",
    )
    steps = _node_html(workflow.plan, statuses, str(task.id), failed)
    return format_html('<div class="sqltasks-workflow">{}<ol>{}</ol></div>', header, steps)


def _node_html(
    node: plan.Node, statuses: dict[str, str], current: str, failed: dict[str, str] | None
) -> str:
    if node["kind"] == "task":
        status = statuses.get(node["id"], "")
        if status == "READY" and node["state"] == plan.WAITING:
            status = "WAITING"  # parked until the steps before it end
        url = reverse("admin:django_sqltasks_taskrecord_change", args=[node["id"]])
        mark = ""
        if failed is not None and failed["task_id"] == node["id"]:
            mark = format_html(" <strong>← {}</strong>", _("this step failed"))
        name = (
            format_html("<strong>{}</strong>", node["path"])
            if node["id"] == current
            else node["path"]
        )
        return format_html(
            '<li>{} <a href="{}">{}</a>{}</li>', status_badge_html(status, status), url, name, mark
        )
    items = format_html_join(
        "", "{}", ((_node_html(child, statuses, current, failed),) for child in plan.children(node))
    )
    if node["kind"] == "chain":
        label = _("chain: one step after another")
    elif node["then"] is None:
        label = _("group: at once")
    else:
        label = _("group: at once, then the last step (on failure: %s)") % node["on_failure"]
    return format_html("<li>{}<ol>{}</ol></li>", label, items)
