"""The worker table: one row per running worker process, whose heartbeat is its lease."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..core.claim_cost import ClaimCost
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
    # What the worker's main claim cost over the last minute (core/claim_cost.py; durations in
    # seconds), as of claim_measured_at (the database's clock), written by the worker's own
    # heartbeat (a supervisor renewing the lease leaves them). NULL where unknown: a row of an
    # earlier version, or a duration with no claim in the window.
    claim_measured_at = models.DateTimeField(_("claims measured at"), null=True, blank=True)
    claim_count = models.PositiveIntegerField(_("claims (last minute)"), null=True, blank=True)
    claim_rows = models.PositiveIntegerField(
        _("tasks claimed (last minute)"), null=True, blank=True
    )
    claim_mean = models.FloatField(_("claim mean (s)"), null=True, blank=True)
    claim_p99 = models.FloatField(_("claim p99 (s)"), null=True, blank=True)
    claim_max = models.FloatField(_("claim max (s)"), null=True, blank=True)
    claim_full_passes = models.PositiveIntegerField(
        _("full passes (last minute)"), null=True, blank=True
    )
    claim_full_pass_max = models.FloatField(_("full pass max (s)"), null=True, blank=True)

    class Meta:
        verbose_name = _("worker")
        verbose_name_plural = _("workers")
        ordering = ["-heartbeat_at"]

    def __str__(self) -> str:
        return self.id

    @property
    def claim_cost(self) -> ClaimCost | None:
        """What the row says its claims cost (None if it says nothing); whether that is still
        true is the reader's to judge, by ``claim_measured_at``."""
        if self.claim_count is None or self.claim_measured_at is None:
            return None
        return ClaimCost(
            count=self.claim_count,
            rows=self.claim_rows or 0,
            mean=self.claim_mean,
            p99=self.claim_p99,
            max=self.claim_max,
            full_passes=self.claim_full_passes,
            full_pass_max=self.claim_full_pass_max,
        )
