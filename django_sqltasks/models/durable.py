"""The tables of durable tasks: the steps a task has recorded (``StepRecord``), and the events
sent to tasks from outside (``EventRecord``). See docs/durable.md.

Neither has a foreign key to the task table: a task's rows are found by its id, and go with it
when it is deleted or pruned (``store/steps.py: forget``).
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..core.columns import MAX_EVENT_KEY_LENGTH, MAX_EVENT_NAME_LENGTH, MAX_STEP_NAME_LENGTH
from ..indexes import PartialIndex


class StepRecord(models.Model):
    """One step of a task (``context.step``), sleep (``context.sleep``) or wait for an event
    (``context.wait_for_event``), with how it ended; the ``occurrence``-th of its name in a run
    of the task (0 for the first)."""

    STEP = "step"
    SLEEP = "sleep"
    EVENT = "event"
    KINDS = [(STEP, _("step")), (SLEEP, _("sleep")), (EVENT, _("event"))]

    DONE = "done"  # a step returned (its result is stored), a sleep is over, an event came
    FAILED = "failed"  # a step raised, last time it ran: it runs again on the next attempt
    WAITING = "waiting"  # a sleep or a wait under way: the task is READY until wake_at
    TIMED_OUT = "timed_out"  # a wait whose timeout passed before its event came
    STATES = [
        (DONE, _("done")),
        (FAILED, _("failed")),
        (WAITING, _("waiting")),
        (TIMED_OUT, _("timed out")),
    ]

    id = models.BigAutoField(primary_key=True)
    task_id = models.UUIDField(_("task"))
    kind = models.CharField(_("kind"), max_length=8, choices=KINDS, default=STEP)
    name = models.CharField(_("name"), max_length=MAX_STEP_NAME_LENGTH)
    occurrence = models.PositiveIntegerField(_("occurrence"), default=0)
    state = models.CharField(_("state"), max_length=10, choices=STATES)
    attempts = models.PositiveIntegerField(
        _("attempts"), default=0, help_text=_("How many times the step ran to its end or raised.")
    )
    result = models.JSONField(_("result"), null=True, blank=True)
    error = models.TextField(_("error"), blank=True, default="")
    # A wait's event key (its name is ``name``); NULL for steps and sleeps.
    event_key = models.CharField(  # noqa: DJ001 - NULL: not a wait
        _("event key"), max_length=MAX_EVENT_KEY_LENGTH, null=True, blank=True
    )
    # When a sleep ends, or a wait times out; NULL: a wait without a timeout.
    wake_at = models.DateTimeField(_("wakes at"), null=True, blank=True)
    started_at = models.DateTimeField(_("started at"), default=timezone.now)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    class Meta:
        verbose_name = _("step")
        verbose_name_plural = _("steps")
        ordering = ["task_id", "id"]
        constraints = [
            # Serves reading a task's steps (the first step call of each attempt), and keeps
            # one record per step: two runs of a task cannot both record it.
            models.UniqueConstraint(
                fields=["task_id", "kind", "name", "occurrence"], name="sqltasks_step_unique"
            )
        ]
        indexes = [
            # Serves the admin's filter of waiting tasks and its count of them.
            PartialIndex(
                fields=["task_id"],
                name="sqltasks_step_waiting_idx",
                where=models.Q(state="waiting"),
                fallback=["state"],
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name}#{self.occurrence} of {self.task_id}"

    @property
    def duration(self) -> float | None:
        """Seconds the step's last run took; None until it ended."""
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


class EventRecord(models.Model):
    """An event of a name and a key: sent (``send_event``) with a payload, awaited by a task
    (``context.wait_for_event``), or both. One row per (name, key), whichever side comes first:
    its unique index is where a send and a wait meet, so neither misses the other."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(_("name"), max_length=MAX_EVENT_NAME_LENGTH)
    key = models.CharField(_("key"), max_length=MAX_EVENT_KEY_LENGTH)
    payload = models.JSONField(_("payload"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    sent_at = models.DateTimeField(_("sent at"), null=True, blank=True)
    # The task waiting for it, or that received it; NULL: none yet.
    task_id = models.UUIDField(_("task"), null=True, blank=True)

    class Meta:
        verbose_name = _("event")
        verbose_name_plural = _("events")
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["name", "key"], name="sqltasks_event_unique"),
        ]
        indexes = [
            # Serves pruning the events sent that no task waited for (store/pruning.py).
            PartialIndex(
                fields=["sent_at"],
                name="sqltasks_event_unclaimed_idx",
                where=models.Q(task_id__isnull=True),
                fallback=["task_id"],
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name}:{self.key}"
