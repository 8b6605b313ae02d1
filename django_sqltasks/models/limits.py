"""The shared concurrency and rate limits of tasks and queues: one row per limit key, the lock
the limited claim takes."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..core.columns import MAX_LIMIT_KEY_LENGTH, MAX_NAME_LENGTH


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
