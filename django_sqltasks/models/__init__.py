"""The app's models, a module per table: the task table (``tasks.py``), the workers, the
periodic tasks, the paused queues, the shared limits and their run-time overrides, the
workflows, and the steps and events of durable tasks. Their path, ``django_sqltasks.models``,
is the app's models module."""

from .durable import EventRecord, StepRecord
from .limits import TaskLimit
from .paused_queues import PausedQueue
from .queue_limits import QueueLimitOverride
from .schedules import ScheduleRecord
from .tasks import FINISHED_STATUSES, QueueOverview, TaskRecord, TaskRecordQuerySet
from .workers import WorkerRecord
from .workflows import WorkflowRecord

__all__ = [
    "FINISHED_STATUSES",
    "EventRecord",
    "PausedQueue",
    "QueueLimitOverride",
    "QueueOverview",
    "ScheduleRecord",
    "StepRecord",
    "TaskLimit",
    "TaskRecord",
    "TaskRecordQuerySet",
    "WorkerRecord",
    "WorkflowRecord",
]
