"""The lengths of the text columns, in characters: the one place that says them.

``models.py`` declares its fields with these, and every check of a name, path or key against its
column reads them here, so a limit cannot drift from the column it protects.
"""

from __future__ import annotations

MAX_TASK_PATH_LENGTH = 255  # TaskRecord.task_path
MAX_NAME_LENGTH = 64  # backend, queue and worker names: TaskRecord.queue_name, WorkerRecord.id, ...
MAX_DEDUPE_KEY_LENGTH = 255  # TaskRecord.dedupe_key
MAX_LIMIT_KEY_LENGTH = 255  # TaskRecord.limit_key, TaskLimit.key
MAX_SUBJECT_TYPE_LENGTH = 100  # TaskRecord.subject_type: "app_label.modelname"
MAX_SUBJECT_ID_LENGTH = 255  # TaskRecord.subject_id: the primary key as text
MAX_SCHEDULE_NAME_LENGTH = 200  # ScheduleRecord.name
MAX_CRON_LENGTH = 200  # ScheduleRecord.cron
MAX_HOSTNAME_LENGTH = 255  # WorkerRecord.hostname
MAX_STEP_NAME_LENGTH = 200  # StepRecord.name: a step's name, or a waited event's
MAX_EVENT_NAME_LENGTH = 200  # EventRecord.name
MAX_EVENT_KEY_LENGTH = 200  # EventRecord.key, StepRecord.event_key
MAX_TRACE_PARENT_LENGTH = 64  # TaskRecord.trace_parent: a W3C traceparent is 55
