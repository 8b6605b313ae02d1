"""The workflows: a chain or group of tasks, its plan, each step's state and its outcome."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..compat import TaskResultStatus
from ..core.columns import MAX_NAME_LENGTH
from ..ids import new_task_id
from ..indexes import PartialIndex


class WorkflowRecord(models.Model):
    """A chain or group of tasks: its plan, each step's state, and its outcome.

    Every change to a workflow starts with an UPDATE of its row (``revision``): that row lock
    is what makes two workers finishing its last two steps at once fire its callback once.
    """

    id = models.UUIDField(primary_key=True, default=new_task_id, editable=False)
    backend_name = models.CharField(_("backend"), max_length=MAX_NAME_LENGTH)
    status = models.CharField(
        _("status"),
        max_length=10,
        choices=TaskResultStatus.choices,
        default=TaskResultStatus.RUNNING,
    )
    # The tree of steps (see workflow_plan.py), with each node's state and result.
    plan = models.JSONField(_("plan"))
    revision = models.PositiveIntegerField(_("revision"), default=0)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    updated_at = models.DateTimeField(_("updated at"), default=timezone.now)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    class Meta:
        verbose_name = _("workflow")
        verbose_name_plural = _("workflows")
        ordering = ["-id"]
        default_permissions = ("view",)
        indexes = [
            # Serves the worker's sweep of running workflows (workflow_store.reconcile).
            PartialIndex(
                fields=["backend_name", "updated_at"],
                name="sqltasks_workflow_running_idx",
                where=models.Q(status=TaskResultStatus.RUNNING),
                fallback=["status"],
            ),
            # Serves pruning: finished workflows of one outcome by age (pruning._prune_workflows).
            # Not partial: SQLite would not take an IN predicate for the query's equality.
            models.Index(
                fields=["backend_name", "status", "finished_at"],
                name="sqltasks_workflow_finished_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"workflow {self.id}"
