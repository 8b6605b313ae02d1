"""The worker table: one row per running worker process, whose heartbeat is its lease."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..core.columns import MAX_HOSTNAME_LENGTH, MAX_NAME_LENGTH


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
