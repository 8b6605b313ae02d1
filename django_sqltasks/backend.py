"""The Django Tasks backend: it writes task rows and reads them back, nothing more."""

from __future__ import annotations

import numbers
import sys
import uuid
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.core import checks
from django.db import DatabaseError, ProgrammingError, connections, router, transaction
from django.utils import timezone

from .compat import (
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from .core import tracing as otel
from .core.limits import limit_key
from .core.options import BackendOptions, OptionError
from .core.resolve import SQLTaskResult, result_from_row, undecodable_row
from .core.serialization import check_arguments, dumps, text_problem
from .core.subject import subject_of_task
from .enqueue.wakeup import has_local_listeners, notify_local
from .exceptions import PayloadTooLarge
from .ids import new_task_id
from .sql import NewTask, dialect_for, installation, packet
from .task import SQLTask, dedupe_key, validate_options

if TYPE_CHECKING:
    from .models import TaskRecord

MAX_TASK_PATH_LENGTH = 255  # TaskRecord.task_path
MAX_NAME_LENGTH = 64  # TaskRecord.queue_name and backend_name
MAX_VALIDATED_TASKS = 4096  # remembered per backend instance; forgotten all at once when full
DEDUPE_TRIES = 3  # inserts of a deduplicated task racing with its holder finishing


class SQLTaskBackend(BaseTaskBackend):
    """Keep every task in a table of the project's own database."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    task_class = SQLTask

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.options_error: OptionError | None = None
        try:
            self.config = BackendOptions.parse(alias, self.options)
        except (OptionError, TypeError) as e:
            # Reported by the system check; enqueue refuses to run until it is fixed.
            self.options_error = e if isinstance(e, OptionError) else OptionError(str(e))
            self.config = BackendOptions()
        # Tasks this instance has validated. Django makes a new backend instance when TASKS
        # changes, so a task is checked again against new settings, as the contract asks.
        self._validated: dict[Task, bool] = {}
        self._installed = False  # set once the app is known to be in INSTALLED_APPS
        # max_allowed_packet per database, for aenqueue's check on the event loop (which may
        # not query); the sync paths read it once per connection instead.
        self._packet_limits: dict[str, int | None] = {}
        # OPTIONS["TRACING"]: spans around enqueues, and runs (read by the worker); None: off,
        # and no method of this instance is wrapped.
        self.tracing = otel.tracing_for(alias, self.config.tracing)
        if self.tracing is not None:
            self.tracing.instrument(self)

    @property
    def database(self) -> str:
        """The database alias holding this backend's tasks."""
        if self.config.database is not None:
            return self.config.database
        from .models import TaskRecord

        return router.db_for_write(TaskRecord)

    def validate_task(self, task: Task) -> None:
        # Before Django's checks, which compare priority with < and would raise a bare
        # TypeError on a string, and take True for 1.
        priority = task.priority
        if isinstance(priority, bool) or not isinstance(priority, numbers.Integral):
            raise InvalidTask(
                f"priority must be a whole number between {TASK_MIN_PRIORITY} and "
                f"{TASK_MAX_PRIORITY}, not {priority!r} (a {type(priority).__name__})."
            )
        queue_name = task.queue_name
        if not isinstance(queue_name, str) or not queue_name:
            raise InvalidTask(f"queue_name must be a non-empty string, not {queue_name!r}.")
        problem = text_problem(queue_name)
        if problem is not None:
            raise InvalidTask(f"Queue name {queue_name!r} {problem}.")
        super().validate_task(task)
        declared = getattr(sys.modules.get(task.func.__module__), task.func.__name__, None)
        if isinstance(declared, Task) and declared.backend != self.alias:
            # Its row would be refused by this backend's workers (results.check_backend).
            raise InvalidTask(
                f"Task {task.module_path} is declared for backend {declared.backend!r}, so "
                f"backend {self.alias!r} does not run it: enqueue it through "
                f"{declared.backend!r}, or declare it with @task(backend={self.alias!r})."
            )
        validate_options(task)
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
        if not self._installed:
            # Without the app its model cannot load: say so before Django's app_label error.
            if not apps.is_installed("django_sqltasks"):
                raise InvalidTaskBackend(installation.not_installed(self.alias))
            self._installed = True

    def _validate_once(self, task: Task) -> None:
        try:
            if task in self._validated:
                return
        except TypeError:  # an unhashable option value: validate every time
            self.validate_task(task)
            return
        self.validate_task(task)
        if len(self._validated) >= MAX_VALIDATED_TASKS:
            self._validated.clear()
        self._validated[task] = True

    def _new_row(self, task: Task, args: Any, kwargs: Any) -> tuple[NewTask, TaskResult]:
        self._validate_once(task)
        check_arguments(args, kwargs)
        now = timezone.now()
        task_id = new_task_id()
        result: TaskResult = SQLTaskResult(
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
            subject=subject_of_task(task),
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
            args_json=dumps(result.args),
            kwargs_json=dumps(result.kwargs),
            dedupe_key=dedupe_key(task, result.args, result.kwargs),
            limit_key=limit_key(task, result.args, result.kwargs),
        )
        limit = self.config.max_payload_bytes
        if limit is not None:
            size = len(row.args_json) + len(row.kwargs_json)
            if size > limit:
                raise PayloadTooLarge(
                    f"Task arguments of {task.module_path} encode to {size} bytes, over the "
                    f"MAX_PAYLOAD_BYTES limit of {limit}: store large data elsewhere and pass "
                    "its key."
                )
        return row, result

    def _check_packet(self, rows: Sequence[NewTask], limit: int | None, many: bool = False) -> None:
        """Refuse a row whose INSERT would exceed the server's max_allowed_packet (MySQL)."""
        if limit is None:
            return
        for index, row in enumerate(rows):
            size = packet.row_size(row) + packet.STATEMENT_OVERHEAD
            if size > limit:
                where = f"calls[{index}]: " if many else ""
                raise PayloadTooLarge(
                    f"{where}Task arguments of {row.task_path} make a statement of about {size} "
                    f"bytes, which exceeds the server's max_allowed_packet of {limit} bytes "
                    "(MySQL and MariaDB drop the connection on a larger statement): store large "
                    "data elsewhere and pass its key, or raise max_allowed_packet."
                )

    def _packet_limit(self, database: str | None = None) -> int | None:
        database = database or self.database
        limit = packet.max_allowed_packet(connections[database])
        self._packet_limits[database] = limit
        return limit

    def enqueue(self, task: Task, args: Iterable[Any], kwargs: dict[str, Any]) -> TaskResult:
        """Queue up a task: one INSERT on the caller's connection, so it joins their transaction."""
        self._check_usable()
        row, result = self._new_row(task, args, kwargs)
        self._check_packet([row], self._packet_limit())
        if row.dedupe_key is not None:
            return self._enqueue_deduplicated(row, result)
        self._write_or_defer([row], [result])
        return result

    def _with_subject(self, task: Task) -> AbstractContextManager[Any]:
        """One transaction for the INSERT and the subject's UPDATE, for a task with a subject
        (others are one statement, and pay no transaction)."""
        if subject_of_task(task) is None:
            return nullcontext()
        return transaction.atomic(using=self.database)

    def _store_subject(self, rows: Sequence[NewTask], task: Task) -> None:
        """Record the subject of ``task`` on its new ``rows``, in the caller's transaction."""
        subject = subject_of_task(task)
        if subject is not None:
            from .models import TaskRecord

            TaskRecord.objects.using(self.database).filter(id__in=[r.id for r in rows]).update(
                subject_type=subject.type, subject_id=subject.id
            )

    def _enqueue_deduplicated(self, row: NewTask, result: TaskResult) -> TaskResult:
        """Insert ``row``, or return the live task that already holds its dedupe key."""
        assert row.dedupe_key is not None
        connection = connections[self.database]
        dialect = dialect_for(connection)
        for _ in range(DEDUPE_TRIES):
            with (
                installation.explain_missing_tables(self.database),
                self._with_subject(result.task),
                connection.cursor() as cursor,
            ):
                if dialect.insert_deduplicated(cursor, row, notify=self.config.notify):
                    self._store_subject([row], result.task)
                    self._after_write([row], [result])
                    return result
                existing = dialect.live_task_with_key(cursor, row.dedupe_key)
            if existing is not None:
                return self.get_result(str(existing))
            # The holder finished between the two statements: try to insert again.
        raise InvalidTask(f"Could not enqueue {row.task_path} with dedupe key {row.dedupe_key!r}.")

    def enqueue_many(
        self, task: Task, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]]
    ) -> list[TaskResult]:
        """Queue up ``task`` once per ``(args, kwargs)`` in ``calls``, in as few statements as
        the database allows (COPY on PostgreSQL); return the results in the same order.

        Every call is checked before anything is written: one bad call raises (naming its
        index) and enqueues nothing.
        """
        self._check_usable()
        rows, results = self._new_rows(task, calls)
        self._check_packet(rows, self._packet_limit(), many=True)
        if rows and rows[0].dedupe_key is not None:
            # Each row may meet a live twin: insert them one by one.
            return [
                self._enqueue_deduplicated(r, res) for r, res in zip(rows, results, strict=True)
            ]
        if rows:
            self._write_or_defer(rows, results)
        return results

    def _new_rows(
        self, task: Task, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]]
    ) -> tuple[list[NewTask], list[TaskResult]]:
        rows: list[NewTask] = []
        results: list[TaskResult] = []
        for index, call in enumerate(calls):
            try:
                args, kwargs = call
            except (TypeError, ValueError) as e:
                raise TypeError(
                    f"calls[{index}] must be an (args, kwargs) pair, not {call!r}."
                ) from e
            try:
                row, result = self._new_row(task, args, kwargs)
            except (TypeError, ValueError, InvalidTask) as e:
                raise type(e)(f"calls[{index}]: {e}") from e
            rows.append(row)
            results.append(result)
        return rows, results

    def _write_or_defer(self, rows: list[NewTask], results: list[TaskResult]) -> None:
        on_commit = self.config.enqueue_on_commit
        if on_commit:
            alias = self.database if on_commit is True else on_commit
            if connections[alias].in_atomic_block:
                transaction.on_commit(partial(self._write, rows, results), using=alias)
                return
        self._write(rows, results)

    def _write(self, rows: list[NewTask], results: list[TaskResult]) -> None:
        database = self.database
        connection = connections[database]
        dialect = dialect_for(connection)
        limit = packet.max_allowed_packet(connection)
        with (
            installation.explain_missing_tables(database),
            self._with_subject(results[0].task),
            connection.cursor() as cursor,
        ):
            if len(rows) == 1:
                dialect.insert(cursor, rows, notify=self.config.notify)
            elif limit is None:
                dialect.bulk_insert(cursor, rows, notify=self.config.notify)
            else:  # MySQL: each INSERT must fit in one packet
                for run in packet.statements(rows, limit):
                    dialect.bulk_insert(cursor, run, notify=self.config.notify)
            self._store_subject(rows, results[0].task)
        self._after_write(rows, results)

    def _after_write(self, rows: list[NewTask], results: list[TaskResult]) -> None:
        database = self.database
        if has_local_listeners(database):
            queues = sorted({row.queue_name for row in rows})
            for queue_name in queues:
                transaction.on_commit(
                    partial(notify_local, database, queue_name), using=database, robust=True
                )
        for result in results:
            task_enqueued.send(type(self), task_result=result)

    async def aenqueue(self, task: Task, args: Iterable[Any], kwargs: dict[str, Any]) -> TaskResult:
        """Queue up a task from async code, sharing INSERTs with concurrent calls.

        It commits on its own (see docs/transactions.md); on PostgreSQL it runs on the event
        loop itself.
        """
        from .enqueue.coalescer import coalescer_for

        self._check_usable()
        row, result = self._new_row(task, args, kwargs)
        database = self.database  # the routers' answer, asked once per call
        if database in self._packet_limits:
            limit = self._packet_limits[database]
        else:
            limit = await sync_to_async(self._packet_limit)(database)
        self._check_packet([row], limit)
        if row.dedupe_key is not None:
            deduplicated: TaskResult = await sync_to_async(self._enqueue_deduplicated)(row, result)
            return deduplicated
        if subject_of_task(task) is not None:  # two statements: not for the shared INSERTs
            await sync_to_async(self._write)([row], [result])
            return result
        coalescer = await coalescer_for(self)
        try:
            await coalescer.submit(row, result)
        except Exception as e:
            if not installation.is_missing_table(e):
                raise
            # PostgreSQL's native writer raises the driver's error: give Django's class.
            kind = type(e) if isinstance(e, DatabaseError) else ProgrammingError
            raise kind(installation.not_migrated(self.database)) from e
        return result

    async def aenqueue_many(
        self, task: Task, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]]
    ) -> list[TaskResult]:
        """Async ``enqueue_many``: one thread hop, one transaction of its own."""
        return await sync_to_async(self._enqueue_many_committed)(task, list(calls))

    def _enqueue_many_committed(
        self, task: Task, calls: list[tuple[Sequence[Any], dict[str, Any]]]
    ) -> list[TaskResult]:
        with transaction.atomic(using=self.database):
            return self.enqueue_many(task, calls)

    def get_result(self, result_id: str) -> TaskResult:
        """Return the task's current state; raise ``TaskResultDoesNotExist`` for an unknown id."""
        from .models import TaskRecord

        try:
            task_uuid = uuid.UUID(str(result_id))
        except ValueError as e:
            raise TaskResultDoesNotExist(result_id) from e
        records = TaskRecord.objects.using(self.database).filter(
            id=task_uuid, backend_name=self.alias
        )
        try:
            record: TaskRecord = records.get()
        except TaskRecord.DoesNotExist as e:
            raise TaskResultDoesNotExist(result_id) from e
        except RecursionError:
            # JSON nested deeper than Python's decoder goes (only PostgreSQL stores it).
            return result_from_row(undecodable_row(records))
        return record.task_result

    def cancel(self, result_id: str) -> bool:
        """Cancel a task: a READY one never runs (FAILED with ``TaskCancelled``); a RUNNING async
        one is cancelled by its worker at the next heartbeat. Return False if it had finished
        (or is a RUNNING sync task, which cannot be interrupted but is flagged all the same).
        """
        from .models import TaskRecord
        from .store import control

        try:
            task_uuid = uuid.UUID(str(result_id))
        except ValueError as e:
            raise TaskResultDoesNotExist(result_id) from e
        records = TaskRecord.objects.using(self.database).filter(
            id=task_uuid, backend_name=self.alias
        )
        record = records.first()
        if record is None:
            raise TaskResultDoesNotExist(result_id)
        if control.cancel([record], using=self.database, reason="Cancelled before it started."):
            return True
        return bool(control.request_cancel([record], using=self.database))

    async def acancel(self, result_id: str) -> bool:
        """Async ``cancel``."""
        cancelled: bool = await sync_to_async(self.cancel)(result_id)
        return cancelled

    async def aget_result(self, result_id: str) -> TaskResult:
        """Async ``get_result``: on the event loop itself on PostgreSQL."""
        from .enqueue.coalescer import coalescer_for

        coalescer = await coalescer_for(self)
        result: TaskResult = await coalescer.get_result(result_id)
        return result

    def pause_queue(self, queue_name: str) -> bool:
        """Stop every worker claiming tasks of ``queue_name`` (they stay READY; running ones
        finish); return False if it was paused already. Raise ``UnknownQueue`` for a name
        outside QUEUES."""
        from .store import flow

        self._check_usable()
        name = flow.check_queue(self.alias, self.queues, queue_name)
        return flow.pause(self.database, self.alias, name)

    def resume_queue(self, queue_name: str) -> bool:
        """Let workers claim tasks of ``queue_name`` again; return False if it was not paused."""
        from .store import flow

        self._check_usable()
        name = flow.check_queue(self.alias, self.queues, queue_name)
        return flow.resume(self.database, self.alias, name, announce=self.config.notify)

    def paused_queues(self) -> list[str]:
        """Return the names of this backend's paused queues, sorted."""
        from .store import flow

        self._check_usable()
        return flow.paused(self.database, self.alias)

    def run_now(self, result_id: str) -> bool:
        """Make a deferred READY task due now, by the database's clock; return False if it is
        not READY (a task due already stays where it is, and True is returned). Raise
        ``TaskResultDoesNotExist`` for an unknown id."""
        from .store import flow

        self._check_usable()
        return flow.run_now(self.database, self.alias, result_id, announce=self.config.notify)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        from .ops.checks import check_backend

        return list(check_backend(self))
