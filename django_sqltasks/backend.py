"""The Django Tasks backend: it writes task rows and reads them back, nothing more."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from django.core import checks
from django.db import connections, router, transaction
from django.utils import timezone

from .compat import (
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from .exceptions import PayloadTooLarge
from .ids import new_task_id
from .options import BackendOptions, OptionError
from .serialization import check_arguments, dumps
from .sql import NewTask, dialect_for
from .wakeup import has_local_listeners, notify_local

if TYPE_CHECKING:
    from .models import TaskRecord

MAX_TASK_PATH_LENGTH = 255  # TaskRecord.task_path
MAX_NAME_LENGTH = 64  # TaskRecord.queue_name and backend_name


class SQLTaskBackend(BaseTaskBackend):
    """Keep every task in a table of the project's own database."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.options_error: OptionError | None = None
        try:
            self.config = BackendOptions.parse(alias, self.options)
        except (OptionError, TypeError) as e:
            # Reported by the system check; enqueue refuses to run until it is fixed.
            self.options_error = e if isinstance(e, OptionError) else OptionError(str(e))
            self.config = BackendOptions()

    @property
    def database(self) -> str:
        """The database alias holding this backend's tasks."""
        if self.config.database is not None:
            return self.config.database
        from .models import TaskRecord

        return router.db_for_write(TaskRecord)

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if len(task.module_path) > MAX_TASK_PATH_LENGTH:
            raise InvalidTask(
                f"Task path {task.module_path!r} is longer than {MAX_TASK_PATH_LENGTH} characters."
            )
        if len(task.queue_name) > MAX_NAME_LENGTH:
            raise InvalidTask(
                f"Queue name {task.queue_name!r} is longer than {MAX_NAME_LENGTH} characters."
            )

    def _check_usable(self) -> None:
        if self.options_error is not None:
            raise InvalidTaskBackend(str(self.options_error))

    def _new_row(self, task: Task, args: Any, kwargs: Any) -> tuple[NewTask, TaskResult]:
        self.validate_task(task)
        check_arguments(args, kwargs)
        now = timezone.now()
        task_id = new_task_id()
        result: TaskResult = TaskResult(
            task=task,
            id=str(task_id),
            status=TaskResultStatus.READY,
            enqueued_at=now,
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        row = NewTask(
            id=task_id,
            task_path=task.module_path,
            backend_name=self.alias,
            queue_name=task.queue_name,
            priority=task.priority,
            args=result.args,
            kwargs=result.kwargs,
            enqueued_at=now,
            run_after=task.run_after,
        )
        limit = self.config.max_payload_bytes
        if limit is not None:
            size = len(dumps(row.args)) + len(dumps(row.kwargs))
            if size > limit:
                raise PayloadTooLarge(
                    f"Task arguments of {task.module_path} encode to {size} bytes, over the "
                    f"MAX_PAYLOAD_BYTES limit of {limit}: store large data elsewhere and pass "
                    "its key."
                )
        return row, result

    def enqueue(self, task: Task, args: Iterable[Any], kwargs: dict[str, Any]) -> TaskResult:
        """Queue up a task: one INSERT on the caller's connection, so it joins their transaction."""
        self._check_usable()
        row, result = self._new_row(task, args, kwargs)
        database = self.database
        connection = connections[database]
        with connection.cursor() as cursor:
            dialect_for(connection).insert(cursor, [row], notify=self.config.notify)
        if has_local_listeners(database):
            transaction.on_commit(
                partial(notify_local, database, row.queue_name), using=database, robust=True
            )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """Return the task's current state; raise ``TaskResultDoesNotExist`` for an unknown id."""
        from .models import TaskRecord

        try:
            task_uuid = uuid.UUID(str(result_id))
        except ValueError as e:
            raise TaskResultDoesNotExist(result_id) from e
        try:
            record: TaskRecord = TaskRecord.objects.using(self.database).get(
                id=task_uuid, backend_name=self.alias
            )
        except TaskRecord.DoesNotExist as e:
            raise TaskResultDoesNotExist(result_id) from e
        return record.task_result

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        from .checks import check_backend

        return list(check_backend(self))
