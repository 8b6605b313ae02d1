"""The one module that knows whether Django Tasks comes from Django itself or the backport.

Django 6.0+ ships ``django.tasks``; Django 5.2 needs the ``django-tasks`` backport (the ``compat``
extra). Everything else in this package imports the Django Tasks API from here.
"""

from __future__ import annotations

from importlib.util import find_spec

if find_spec("django.tasks") is not None:
    from django.tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskError
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import log_task_enqueued as logs_task_enqueued
    from django.tasks.signals import log_task_finished as logs_task_finished
    from django.tasks.signals import log_task_started as logs_task_started
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    TASKS_LOGGER = "django.tasks"  # the logger of Django Tasks' own receivers
elif find_spec("django_tasks") is not None:  # pragma: no cover - exercised by the Django 5.2 leg
    from django_tasks import (  # type: ignore[no-redef]
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
    from django_tasks.base import (  # type: ignore[no-redef]
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskError,
    )
    from django_tasks.exceptions import (  # type: ignore[no-redef]
        InvalidTaskBackendError as InvalidTaskBackend,
    )
    from django_tasks.exceptions import (  # type: ignore[no-redef]
        InvalidTaskError as InvalidTask,
    )
    from django_tasks.exceptions import (  # type: ignore[no-redef]
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django_tasks.signals import (  # type: ignore[no-redef]
        log_task_enqueued as logs_task_enqueued,
    )
    from django_tasks.signals import (  # type: ignore[no-redef]
        log_task_finished as logs_task_finished,
    )
    from django_tasks.signals import (  # type: ignore[no-redef]
        log_task_started as logs_task_started,
    )
    from django_tasks.signals import (  # type: ignore[no-redef]
        task_enqueued,
        task_finished,
        task_started,
    )
    from django_tasks.utils import normalize_json  # type: ignore[no-redef]

    TASKS_LOGGER = "django_tasks"
else:  # pragma: no cover
    import sys

    raise ImportError(
        "django-sqltasks needs Django Tasks: use Django 6.0+ (which needs Python 3.12+), or "
        "install 'django-sqltasks[compat]' on Django 5.2"
        + (
            f" (this is Python {sys.version_info[0]}.{sys.version_info[1]}: Django 6 is not "
            "available for it, so pip installed Django 5.2)."
            if sys.version_info < (3, 12)
            else "."
        )
    )

__all__ = [
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_QUEUE_NAME",
    "TASKS_LOGGER",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "logs_task_enqueued",
    "logs_task_finished",
    "logs_task_started",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
