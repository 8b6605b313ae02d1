"""The tables beside the task table: workers, periodic schedules, paused queues, limits and
workflows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..compat import TaskResultStatus
from ..core.columns import (
    MAX_CRON_LENGTH,
    MAX_HOSTNAME_LENGTH,
    MAX_LIMIT_KEY_LENGTH,
    MAX_NAME_LENGTH,
    MAX_SCHEDULE_NAME_LENGTH,
    MAX_TASK_PATH_LENGTH,
)
from ..ids import new_task_id
from ..indexes import PartialIndex

if TYPE_CHECKING:
    pass


class WorkerRecord(models.Model):
    """A running worker process; its heartbeat is the lease on every task it holds."""

    id = models.CharField(_("worker id"), primary_key=True, max_length=MAX_NAME_LENGTH)
    backend_name = models.CharField(_("backend"), max_length=MAX_NAME_LENGTH)
    queue_names = models.JSONField(_("queues"), default=list)
    hostname = models.CharField(_("hostname"), max_length=MAX_HOSTNAME_LENGTH, blank=True)
    pid = models.PositiveIntegerField(_("pid"), null=True, blank=True)
    concurrency = models.PositiveIntegerField(_("concurrency"), default=1)
    started_at = models.DateTimeField(_("started at"), default=timezone.now)
    heartbeat_at = models.DateTimeField(_("last heartbeat"), default=timezone.now, db_index=True)
    # Who the process is beyond host and pid (boot id, PID namespace, start time, a random
    # token; worker/identity.py), so that a worker starting with this id can tell whether the
    # holder is surely dead. Blank: a row of an earlier version.
    process = models.CharField(_("process"), max_length=200, blank=True, default="")

    class Meta:
        verbose_name = _("worker")
        verbose_name_plural = _("workers")
        ordering = ["-heartbeat_at"]

    def __str__(self) -> str:
        return self.id


class ScheduleRecord(models.Model):
    """A periodic task: what to enqueue and when, and the last slot it was enqueued for.

    Rows come from the admin or from ``OPTIONS["PERIODIC"]`` (synced at each worker's start;
    see ``store/schedules.py``). Every worker reads the due rows (by ``next_run_at``) at each
    scheduler tick; advancing ``last_slot`` with a guarded UPDATE is the election of the one
    worker that enqueues a slot. ``revision`` grows with each change of the definition, so an
    election made on a definition read before a change fails, and the next tick reads the new
    one.
    """

    ADMIN = "admin"
    SETTINGS = "settings"
    REMOVED = "removed"
    ORIGINS = [
        (ADMIN, _("admin")),
        (SETTINGS, _("settings (PERIODIC)")),
        (REMOVED, _("removed from settings")),
    ]

    backend_name = models.CharField(_("backend"), max_length=MAX_NAME_LENGTH)
    name = models.CharField(_("name"), max_length=MAX_SCHEDULE_NAME_LENGTH)
    # Null until a worker first sees the schedule (it then starts at its latest past slot).
    last_slot = models.DateTimeField(_("last slot"), null=True, blank=True)
    task_path = models.CharField(_("task"), max_length=MAX_TASK_PATH_LENGTH, blank=True)
    args = models.JSONField(_("args"), default=list, blank=True)
    kwargs = models.JSONField(_("kwargs"), default=dict, blank=True)
    cron = models.CharField(_("cron"), max_length=MAX_CRON_LENGTH, blank=True)
    every = models.FloatField(_("every (seconds)"), null=True, blank=True)
    # Blank: the backend's TIME_ZONE option (cron only).
    time_zone = models.CharField(_("time zone"), max_length=MAX_NAME_LENGTH, blank=True)
    # Blank / null: the task's own queue and priority.
    queue_name = models.CharField(_("queue"), max_length=MAX_NAME_LENGTH, blank=True)
    priority = models.SmallIntegerField(_("priority"), null=True, blank=True)
    enabled = models.BooleanField(_("enabled"), default=True)
    origin = models.CharField(_("origin"), max_length=10, choices=ORIGINS, default=ADMIN)
    revision = models.PositiveIntegerField(_("revision"), default=0)
    last_run_at = models.DateTimeField(_("last run"), null=True, blank=True)
    last_task_id = models.UUIDField(_("last task"), null=True, blank=True)
    next_run_at = models.DateTimeField(_("next run"), null=True, blank=True)
    # Why the last slot enqueued nothing (its task does not import, its arguments do not fit);
    # blank once a slot enqueues.
    last_error = models.TextField(_("last error"), blank=True)
    updated_at = models.DateTimeField(_("updated at"), default=timezone.now)

    class Meta:
        verbose_name = _("periodic task")
        verbose_name_plural = _("periodic tasks")
        ordering = ["backend_name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["backend_name", "name"], name="sqltasks_schedule_name")
        ]
        indexes = [
            # Serves the scheduler's tick (worker/scheduler.py: Scheduler.read): the enabled
            # rows whose next run is unknown (by id) or has come (by next run, then id), read
            # in batches, so that a tick reads its due rows and not the whole table.
            models.Index(
                fields=["backend_name", "enabled", "next_run_at", "id"],
                name="sqltasks_schedule_due_idx",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class PausedQueue(models.Model):
    """A queue of one backend whose READY tasks no worker claims until it is resumed."""

    backend_name = models.CharField(_("backend"), max_length=MAX_NAME_LENGTH)
    queue_name = models.CharField(_("queue"), max_length=MAX_NAME_LENGTH)
    paused_at = models.DateTimeField(_("paused at"), default=timezone.now)

    class Meta:
        verbose_name = _("paused queue")
        verbose_name_plural = _("paused queues")
        ordering = ["backend_name", "queue_name"]
        default_permissions = ("view",)
        permissions = [("pause_queue", _("Can pause and resume queues"))]
        constraints = [
            # Serves the claim's NOT EXISTS (sql.*.claim): one lookup per queue it reads.
            models.UniqueConstraint(
                fields=["backend_name", "queue_name"], name="sqltasks_paused_queue"
            )
        ]

    def __str__(self) -> str:
        return f"{self.backend_name}: {self.queue_name}"


class TaskLimit(models.Model):
    """A concurrency or rate limit shared by every worker: of a task (``@task(concurrency_limit=
    ..., rate_limit=...)``, per key if it has one) or of a queue (``OPTIONS["QUEUE_LIMITS"]``).

    Workers create these rows for the limit keys they find on READY tasks, with the limits of
    their own code and settings (shown here as last written). A row is the lock the limited
    claim takes, so that two workers never both fill its last slot; the tasks RUNNING under it
    are counted, not stored, so a rescued task gives its slot back with no bookkeeping.
    """

    backend_name = models.CharField(_("backend"), max_length=MAX_NAME_LENGTH)
    # "task:<path>", "task:<path>#<key>" or "queue:<name>".
    key = models.CharField(_("key"), max_length=MAX_LIMIT_KEY_LENGTH)
    concurrency = models.PositiveIntegerField(
        _("concurrency limit"), null=True, blank=True, help_text=_("At most this many RUNNING.")
    )
    rate = models.PositiveIntegerField(
        _("rate limit"), null=True, blank=True, help_text=_("At most this many starts a period.")
    )
    period = models.FloatField(_("period (seconds)"), null=True, blank=True)
    # The database-clock times (epoch seconds) of the starts within the last period, oldest
    # first: the rate limit's sliding window.
    starts = models.JSONField(_("recent starts"), default=list, blank=True)
    updated_at = models.DateTimeField(_("updated at"), default=timezone.now)

    class Meta:
        verbose_name = _("limit")
        verbose_name_plural = _("limits")
        ordering = ["backend_name", "key"]
        default_permissions = ("view",)
        constraints = [
            models.UniqueConstraint(fields=["backend_name", "key"], name="sqltasks_limit_key")
        ]

    def __str__(self) -> str:
        return f"{self.backend_name}: {self.key}"


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
