"""The paused queues, whose READY tasks no worker claims until they are resumed."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..core.columns import MAX_NAME_LENGTH


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
