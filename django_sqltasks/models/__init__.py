"""The app's models: the task table (``tasks.py``) and the tables beside it (``records.py``).
Their path, ``django_sqltasks.models``, is the app's models module."""

from .queue_limits import QueueLimitOverride
from .records import PausedQueue, ScheduleRecord, TaskLimit, WorkerRecord, WorkflowRecord
from .tasks import FINISHED_STATUSES, QueueOverview, TaskRecord, TaskRecordQuerySet

__all__ = [
    "FINISHED_STATUSES",
    "PausedQueue",
    "QueueLimitOverride",
    "QueueOverview",
    "ScheduleRecord",
    "TaskLimit",
    "TaskRecord",
    "TaskRecordQuerySet",
    "WorkerRecord",
    "WorkflowRecord",
]
