"""The periodic tasks: what to enqueue and when (``OPTIONS["PERIODIC"]`` and the admin)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..core.columns import (
    MAX_CRON_LENGTH,
    MAX_NAME_LENGTH,
    MAX_SCHEDULE_NAME_LENGTH,
    MAX_TASK_PATH_LENGTH,
)


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
