"""Queue limits set at run time, over ``OPTIONS["QUEUE_LIMITS"]``."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..core.columns import MAX_NAME_LENGTH
from ..core.limits import Limit


class QueueLimitOverride(models.Model):
    """An operator's concurrency or rate limit for one queue, in force on every worker over
    the settings' (``OPTIONS["QUEUE_LIMITS"]``) until it is deleted.

    Each limit left NULL keeps the settings' one. Workers read these rows in each limited
    claim that takes the queue's tasks, and look for new ones as often as they look for
    limited tasks (``worker/limited.py``): a queue the settings do not limit is limited from
    then on, and no longer once its override is gone.
    """

    backend_name = models.CharField(_("backend"), max_length=MAX_NAME_LENGTH)
    queue_name = models.CharField(_("queue"), max_length=MAX_NAME_LENGTH)
    concurrency = models.PositiveIntegerField(
        _("concurrency limit"),
        null=True,
        blank=True,
        help_text=_("At most this many of the queue's tasks RUNNING; blank: the settings'."),
    )
    rate = models.PositiveIntegerField(
        _("rate limit"),
        null=True,
        blank=True,
        help_text=_("At most this many starts a period; blank: the settings'."),
    )
    period = models.FloatField(_("period (seconds)"), null=True, blank=True)
    updated_at = models.DateTimeField(_("updated at"), default=timezone.now)

    class Meta:
        verbose_name = _("queue limit override")
        verbose_name_plural = _("queue limit overrides")
        ordering = ["backend_name", "queue_name"]
        constraints = [
            models.UniqueConstraint(
                fields=["backend_name", "queue_name"], name="sqltasks_queue_limit_override"
            )
        ]

    def __str__(self) -> str:
        return f"{self.backend_name}: {self.queue_name}"

    @property
    def limit(self) -> Limit:
        return Limit(concurrency=self.concurrency, rate=self.rate, period=self.period)
