"""The task table, and the queries named after what they select."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..compat import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskResultStatus
from ..core.columns import (
    MAX_DEDUPE_KEY_LENGTH,
    MAX_LIMIT_KEY_LENGTH,
    MAX_NAME_LENGTH,
    MAX_SUBJECT_ID_LENGTH,
    MAX_SUBJECT_TYPE_LENGTH,
    MAX_TASK_PATH_LENGTH,
    MAX_TRACE_PARENT_LENGTH,
)
from ..core.subject import subject_of
from ..ids import finished_not_before, new_task_id
from ..indexes import (
    ARGUMENT_VALUES_SQL,
    ERROR_CLASS_NAME_SQL,
    FilterIndex,
    InConstants,
    LiveDedupeConstraint,
    PartialIndex,
    PostgreSQLIndex,
)
from ..task import result_from_row

if TYPE_CHECKING:
    from ..compat import TaskResult

FINISHED_STATUSES = (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
LIVE_STATUSES = (TaskResultStatus.READY, TaskResultStatus.RUNNING)


class TaskRecordQuerySet(models.QuerySet["TaskRecord"]):
    def for_backend(self, alias: str) -> TaskRecordQuerySet:
        """Tasks enqueued through the backend ``alias``."""
        return self.filter(backend_name=alias)

    def scoped(self, backend: str | None, queue: str | None) -> TaskRecordQuerySet:
        """Tasks of ``backend`` (any when None) in ``queue`` (any when None): the scope an
        operator's view or command names."""
        tasks = self if backend is None else self.for_backend(backend)
        return tasks if queue is None else tasks.in_queues([queue])

    def in_queues(self, queue_names: list[str] | None) -> TaskRecordQuerySet:
        """Tasks in any of ``queue_names``; ``None`` means every queue."""
        return self if queue_names is None else self.filter(queue_name__in=queue_names)

    def with_id(self, task_id: uuid.UUID, *, partitioned: bool) -> TaskRecordQuerySet:
        """The task ``task_id``; in a ``partitioned`` table (PostgreSQL), read so that the
        planner skips the days of history it cannot be in (``ids.finished_not_before``). An id
        that is not a UUIDv7, or whose time is in the future, is read over every partition."""
        tasks = self.filter(id=task_id)
        earliest = finished_not_before(task_id) if partitioned else None
        if earliest is None:
            return tasks
        return tasks.filter(
            models.Q(status__in=LIVE_STATUSES)
            | models.Q(finished_at__gte=earliest)
            | models.Q(finished_at__isnull=True)  # in the default partitions, read anyway
        )

    def ready(self) -> TaskRecordQuerySet:
        """Tasks waiting to run, due or not."""
        return self.filter(status=TaskResultStatus.READY)

    def due(self, now: datetime | None = None) -> TaskRecordQuerySet:
        """Tasks a worker may claim now."""
        return self.ready().filter(available_at__lte=now or timezone.now())

    def scheduled(self, now: datetime | None = None) -> TaskRecordQuerySet:
        """Ready tasks whose run_after is still in the future."""
        return self.ready().filter(available_at__gt=now or timezone.now())

    def running(self) -> TaskRecordQuerySet:
        """Tasks claimed by a worker."""
        return self.filter(status=TaskResultStatus.RUNNING)

    def owned_by(self, worker_id: str) -> TaskRecordQuerySet:
        """Running tasks held by ``worker_id``."""
        return self.running().filter(owner=worker_id)

    def finished(self) -> TaskRecordQuerySet:
        """Tasks that succeeded or failed for good (in the finished index's own words, so that
        SQLite uses it: ``indexes.InConstants``)."""
        return self.filter(InConstants("status", FINISHED_STATUSES))

    def succeeded(self) -> TaskRecordQuerySet:
        return self.filter(status=TaskResultStatus.SUCCESSFUL)

    def failed(self) -> TaskRecordQuerySet:
        return self.filter(status=TaskResultStatus.FAILED)

    def finished_before(self, cutoff: datetime) -> TaskRecordQuerySet:
        """Finished tasks whose finished_at is at or before ``cutoff``."""
        return self.finished().filter(finished_at__lte=cutoff)

    def for_subject(self, obj: Any) -> TaskRecordQuerySet:
        """Tasks enqueued about ``obj``, a saved model instance (or a ``Subject``)."""
        subject = subject_of(obj)
        return self.filter(subject_type=subject.type, subject_id=subject.id)


class TaskRecord(models.Model):
    """One enqueued task: its call, its state, and every attempt to run it."""

    id = models.UUIDField(primary_key=True, default=new_task_id, editable=False)
    task_path = models.CharField(_("task path"), max_length=MAX_TASK_PATH_LENGTH)
    backend_name = models.CharField(_("backend"), max_length=MAX_NAME_LENGTH)
    queue_name = models.CharField(_("queue"), max_length=MAX_NAME_LENGTH)
    priority = models.SmallIntegerField(_("priority"), default=0)
    status = models.CharField(
        _("status"),
        max_length=10,
        choices=TaskResultStatus.choices,
        default=TaskResultStatus.READY,
    )
    args = models.JSONField(_("args"), default=list)
    kwargs = models.JSONField(_("kwargs"), default=dict)
    return_value = models.JSONField(_("return value"), null=True, blank=True)
    errors = models.JSONField(_("errors"), default=list, blank=True)
    worker_ids = models.JSONField(_("worker ids"), default=list, blank=True)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    rescues = models.PositiveIntegerField(
        _("rescues"),
        default=0,
        db_default=0,  # the enqueue's raw INSERT leaves it out
        help_text=_("How many times this task went back in the queue because its worker was lost."),
    )
    snoozes = models.PositiveIntegerField(
        _("snoozes"),
        default=0,
        db_default=0,  # the enqueue's raw INSERT leaves it out
        help_text=_("How many times this task raised Snooze to run again later."),
    )
    # NULL, not "", means unowned: the running-index and the owner guards compare on it.
    owner = models.CharField(  # noqa: DJ001
        _("owner"),
        max_length=MAX_NAME_LENGTH,
        null=True,
        blank=True,
        help_text=_("The worker holding this task while it runs."),
    )
    enqueued_at = models.DateTimeField(_("enqueued at"), default=timezone.now)
    run_after = models.DateTimeField(_("run after"), null=True, blank=True)
    available_at = models.DateTimeField(
        _("available at"),
        default=timezone.now,
        help_text=_("The earliest time a worker may claim this task."),
    )
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    last_attempted_at = models.DateTimeField(_("last attempted at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    cancel_requested = models.BooleanField(
        _("cancel requested"),
        default=False,
        db_default=False,  # the enqueue's raw INSERT leaves it out
        help_text=_(
            "Set to stop a running async task; its worker cancels it at its next heartbeat."
        ),
    )
    dedupe_key = models.CharField(  # noqa: DJ001 - NULL: no deduplication
        _("dedupe key"),
        max_length=MAX_DEDUPE_KEY_LENGTH,
        null=True,
        blank=True,
        help_text=_(
            "While a task with this key is READY or RUNNING, enqueueing it again returns that task."
        ),
    )

    # The model row the task is about (task.using(subject=obj)): its concrete model's label
    # and its primary key as text. NULL: about no row.
    subject_type = models.CharField(  # noqa: DJ001 - NULL: no subject
        _("subject type"), max_length=MAX_SUBJECT_TYPE_LENGTH, null=True, blank=True
    )
    subject_id = models.CharField(  # noqa: DJ001 - NULL: no subject
        _("subject id"), max_length=MAX_SUBJECT_ID_LENGTH, null=True, blank=True
    )

    # The limit this task counts against (@task(concurrency_limit=..., rate_limit=...)):
    # a TaskLimit's key. NULL: no limit of its task; the worker's main claim takes only these.
    limit_key = models.CharField(  # noqa: DJ001 - NULL: no limit
        _("limit key"),
        max_length=MAX_LIMIT_KEY_LENGTH,
        null=True,
        blank=True,
        db_default=None,  # the enqueue's raw INSERT leaves it out for unlimited tasks
        help_text=_("The concurrency or rate limit this task waits on and counts against."),
    )

    # What the running attempt last reported (context.set_progress / set_metadata): a JSON
    # object naming its attempt, written at most once per heartbeat. NULL: nothing reported.
    progress = models.JSONField(
        _("progress"),
        null=True,
        blank=True,
        db_default=None,  # the enqueue's raw INSERT leaves it out
        help_text=_("The progress, note and metadata the task's latest attempt reported."),
    )
    # The W3C traceparent of the enqueue's span (OPTIONS["TRACING"]); NULL: not traced.
    trace_parent = models.CharField(  # noqa: DJ001 - NULL: not traced
        _("trace parent"),
        max_length=MAX_TRACE_PARENT_LENGTH,
        null=True,
        blank=True,
        db_default=None,
    )

    # The workflow (chain or group) this task is a step of; NULL: none. No index: a workflow
    # reads its tasks by their ids, which its plan holds, so enqueues without one pay nothing.
    workflow_id = models.UUIDField(
        _("workflow"),
        null=True,
        blank=True,
        db_default=None,  # the enqueue's raw INSERT leaves it out
        help_text=_("The chain or group this task is a step of."),
    )
    # Labels set at enqueue (@task(tags=...), using(tags=...)): a JSON list of strings; NULL,
    # not [], when there are none, so that the tag index holds only tagged tasks.
    tags = models.JSONField(
        _("tags"),
        null=True,
        blank=True,
        help_text=_("Labels set when the task was enqueued, to find it by."),
    )

    objects = TaskRecordQuerySet.as_manager()

    class Meta:
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        # Newest first. Ids are UUIDv7, made at enqueue time: their order is the enqueue order,
        # and the primary key serves it, so no index on enqueued_at costs every status change.
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(priority__gte=TASK_MIN_PRIORITY)
                & models.Q(priority__lte=TASK_MAX_PRIORITY),
                name="sqltasks_priority_range",
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=TaskResultStatus.values),
                name="sqltasks_status_valid",
            ),
            # Serves deduplication: at most one live task per dedupe key.
            LiveDedupeConstraint(name="sqltasks_dedupe_live"),
        ]
        indexes = [
            # Serves the claim query (sql.*.claim): due rows of a backend's queues, best first.
            # Tasks under a limit are left out: the limited claim reads them by limit key.
            PartialIndex(
                fields=["backend_name", "queue_name", "-priority", "available_at"],
                name="sqltasks_ready_idx",
                where=models.Q(status=TaskResultStatus.READY, limit_key__isnull=True),
                fallback=["status", "limit_key"],
            ),
            # Serves the claim of a worker on several queues or on all ('*'): the order comes
            # from the index, so the claim need not sort every ready row of those queues.
            PartialIndex(
                fields=["backend_name", "-priority", "available_at"],
                name="sqltasks_ready_all_idx",
                where=models.Q(status=TaskResultStatus.READY, limit_key__isnull=True),
                fallback=["status", "limit_key"],
            ),
            # Serves the limited claim (sql.*.claim_limited): one limit's due rows, best first.
            PartialIndex(
                fields=["backend_name", "limit_key", "-priority", "available_at"],
                name="sqltasks_ready_limited_idx",
                where=models.Q(status=TaskResultStatus.READY, limit_key__isnull=False),
                fallback=["status"],
            ),
            # Serves the look for suspects under a limit (sql.suspects: _suspects_sql): the few
            # READY limited tasks marked in the year 9998, among however many limit keys.
            PartialIndex(
                fields=["backend_name", "available_at"],
                name="sqltasks_ready_limited_at_idx",
                where=models.Q(status=TaskResultStatus.READY, limit_key__isnull=False),
                fallback=["status"],
            ),
            # Serves the rescue of tasks whose worker stopped heartbeating.
            PartialIndex(
                fields=["owner"],
                name="sqltasks_running_idx",
                where=models.Q(status=TaskResultStatus.RUNNING),
                fallback=["status"],
            ),
            # Serves a worker's look for cancel requests among its RUNNING tasks, at every
            # heartbeat, on PostgreSQL: the running index holds an entry for every task the
            # worker claimed while a snapshot is held (each dead, but not removable), this one
            # only the few asked to stop. SQLite keeps no dead entries; MariaDB, without
            # partial indexes, reads the running index's (status, owner) as before.
            PostgreSQLIndex(
                name="sqltasks_cancel_requested_idx",
                expression="owner",
                where="status = 'RUNNING' AND cancel_requested",
                using="btree",
            ),
            # Serves pruning: finished rows by age.
            PartialIndex(
                fields=["finished_at"],
                name="sqltasks_finished_idx",
                where=models.Q(status__in=FINISHED_STATUSES),
                fallback=["status"],
            ),
            # Serves the tasks of one row (for_subject): its admin page, and the cancelling of
            # its READY tasks when it is deleted. Rows about no subject are left out of it.
            PartialIndex(
                fields=["subject_type", "subject_id"],
                name="sqltasks_subject_idx",
                where=models.Q(subject_type__isnull=False),
                fallback=[],
            ),
            # Serve the admin's search (sql/search.py), on PostgreSQL: a value of a task's
            # arguments (an e-mail, an order number), the class a failed task failed with, a
            # tag. The first is written at every enqueue and status change (docs/admin.md says
            # what it costs); the others hold only failed tasks and tagged ones.
            PostgreSQLIndex(name="sqltasks_argument_values_idx", expression=ARGUMENT_VALUES_SQL),
            PostgreSQLIndex(
                name="sqltasks_error_class_idx",
                expression=ERROR_CLASS_NAME_SQL,
                where="status = 'FAILED'",
                using="btree",
            ),
            PostgreSQLIndex(name="sqltasks_tags_idx", expression="tags", where="tags IS NOT NULL"),
            # Serve the admin's filter by a task or a queue on MariaDB and SQLite, newest first
            # (PostgreSQL reads the argument index's entry for them instead): a filter by a
            # task with no stored task read all 5 million rows there (54 s on MariaDB). They
            # cost an entry at enqueue and pruning only: neither column ever changes.
            FilterIndex(fields=["task_path", "id"], name="sqltasks_task_path_idx"),
            FilterIndex(fields=["queue_name", "id"], name="sqltasks_queue_name_idx"),
            # No other index: a status change rewrites the row in every index (the partial
            # indexes' predicates name status, so no update is HOT), and each one cost the
            # claim and the outcome write about 15% more. The admin's pages read the primary
            # key, newest first; one led by status would also tempt the planner away from the
            # ready and running indexes for the claim and the rescue.
        ]
        permissions = [
            ("retry_taskrecord", _("Can retry failed tasks")),
            ("cancel_taskrecord", _("Can cancel tasks that have not started")),
            ("run_taskrecord", _("Can run deferred tasks now")),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} ({self.id})"

    @property
    def task_name(self) -> str:
        return self.task_path.rsplit(".", 1)[-1]

    @property
    def duration(self) -> timedelta | None:
        """Time from the last start to the finish, for finished tasks."""
        start = self.last_attempted_at or self.started_at
        if start is None or self.finished_at is None:
            return None
        return self.finished_at - start

    @property
    def task_result(self) -> TaskResult:
        """Return this row as a Django Tasks ``TaskResult``."""
        return result_from_row(
            {f.attname: getattr(self, f.attname) for f in self._meta.concrete_fields}
        )


class QueueOverview(TaskRecord):
    """The admin's queue overview page; a proxy so that it is listed in the admin index."""

    class Meta:
        proxy = True
        verbose_name = _("queue overview")
        verbose_name_plural = _("queue overview")
