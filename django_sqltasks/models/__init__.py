"""The app's models: the task table (``tasks.py``) and the tables beside it (``records.py``).
Their path, ``django_sqltasks.models``, is the app's models module."""

from .durable import EventRecord, StepRecord
from .queue_limits import QueueLimitOverride
from .records import PausedQueue, ScheduleRecord, TaskLimit, WorkerRecord, WorkflowRecord
from .tasks import FINISHED_STATUSES, QueueOverview, TaskRecord, TaskRecordQuerySet

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
