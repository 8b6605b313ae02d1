"""The Django Tasks backend: a thin facade over the layers below.

It validates tasks and hands their rows to ``enqueue/`` (building, writing, the async
coalescer); reads, cancels, queue control and workflows go to ``store/`` through one door
(``store/operations.py``), which it imports at its first call: ``store/`` imports the models,
and this module loads whenever a ``@task`` is declared, possibly before Django's app registry
is ready.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.core import checks
from django.db import DatabaseError, ProgrammingError, connections, router, transaction

from .compat import BaseTaskBackend, InvalidTask, Task, TaskResult
from .core import tracing
from .core.config_checks import check_backend
from .core.options import BackendOptions, OptionError
from .core.policy import check_priority_and_queue, check_queue_known, validate_options
from .core.subject import subject_of_task
from .core.workflow_plan import Node, StepCalls
from .core.workflows import WorkflowResult
from .enqueue import rows, writes
from .enqueue.coalescer import coalescer_for
from .sql import NewTask, engine_vendor, installation, packet
from .task import SQLTask

if TYPE_CHECKING:
    from .store.operations import Operations

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
        self._usable = False  # set once check_usable() has passed
        # max_allowed_packet per database, for aenqueue's check on the event loop (which may
        # not query); the sync paths read it once per connection instead.
        self._packet_limits: dict[str, int | None] = {}
        # OPTIONS["TRACING"]: spans around enqueues, and runs (read by the worker); None: off.
        self.tracing = tracing.tracing_for(alias, self.config.tracing)
        self._rows = rows.RowBuilder(self)

    @property
    def database(self) -> str:
        """The database alias holding this backend's tasks."""
        if self.config.database is not None:
            return self.config.database
        # App registry: the model exists only once apps are ready (see the module docstring).
        from .models import TaskRecord

        return router.db_for_write(TaskRecord)

    @cached_property
    def store(self) -> Operations:
        """What this backend asks of ``store/`` (reads, cancels, queue control, workflows)."""
        # App registry: store/ imports the models (see the module docstring).
        from .store.operations import Operations

        return Operations(self)

    def validate_task(self, task: Task) -> None:
        check_priority_and_queue(task)  # before Django's checks, which take True for 1
        check_queue_known(task, self.alias, self.queues)
        super().validate_task(task)
        validate_options(task, self.alias)

    def new_row(self, task: Task, args: Any, kwargs: Any) -> tuple[NewTask, TaskResult]:
        """Validate ``task`` (once per instance) and build the row of one call of it."""
        return self._rows.row(task, args, kwargs)

    def check_usable(self) -> None:
        """Raise ``InvalidTaskBackend`` when OPTIONS are wrong or the app is not installed."""
        if not self._usable:
            rows.check_usable(self.alias, self.options_error)
            self._usable = True

    @contextmanager
    def _span(self, task: Task, results: list[TaskResult], count: int = 1) -> Iterator[None]:
        """The enqueue's span (OPTIONS["TRACING"]), naming the first enqueued task; or nothing."""
        if self.tracing is None:
            yield
            return
        with self.tracing.enqueue(task, count) as span:
            yield
            self.tracing.enqueued(span, [r.id for r in results])

    def _packet_limit(self, database: str | None = None) -> int | None:
        database = database or self.database
        limit = packet.max_allowed_packet(connections[database])
        self._packet_limits[database] = limit
        return limit

    def enqueue(self, task: Task, args: Iterable[Any], kwargs: dict[str, Any]) -> TaskResult:
        """Queue up a task: one INSERT on the caller's connection, so it joins their transaction."""
        results: list[TaskResult] = []
        with self._span(task, results):
            self.check_usable()
            row, result = self._rows.call(task, args, kwargs)
            rows.check_packet([row], self._packet_limit())
            if row.dedupe_key is not None:
                result = self._enqueue_deduplicated(row, result)
            else:
                self._write_or_defer([row], [result])
            results.append(result)
        return result

    def _enqueue_deduplicated(self, row: NewTask, result: TaskResult) -> TaskResult:
        """Insert ``row``, or return the live task that already holds its dedupe key."""
        for _ in range(DEDUPE_TRIES):
            holder = writes.insert_deduplicated(
                self.database, row, result, notify=self.config.notify, sender=type(self)
            )
            if holder is None:
                return result
            if holder:
                return self.get_result(holder)
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
        calls = list(calls)
        results: list[TaskResult] = []
        with self._span(task, results, len(calls)):
            self.check_usable()
            new, built = rows.new_rows(task, calls, self._rows.call)
            rows.check_packet(new, self._packet_limit(), many=True)
            if new and new[0].dedupe_key is not None:
                # Each row may meet a live twin: insert them one by one.
                built = [
                    self._enqueue_deduplicated(r, res) for r, res in zip(new, built, strict=True)
                ]
            elif new:
                self._write_or_defer(new, built)
            results.extend(built)
        return results

    def _write_or_defer(self, new: list[NewTask], results: list[TaskResult]) -> None:
        writes.write_or_defer(
            self.database,
            self.config.enqueue_on_commit,
            new,
            results,
            notify=self.config.notify,
            sender=type(self),
        )

    async def aenqueue(self, task: Task, args: Iterable[Any], kwargs: dict[str, Any]) -> TaskResult:
        """Queue up a task from async code, sharing INSERTs with concurrent calls.

        It commits on its own (see docs/transactions.md); on PostgreSQL it runs on the event
        loop itself.
        """
        if self.tracing is None:  # no span: spare the context manager its generator
            return await self._aenqueue(task, args, kwargs)
        results: list[TaskResult] = []
        with self._span(task, results):
            result = await self._aenqueue(task, args, kwargs)
            results.append(result)
        return result

    async def _aenqueue(
        self, task: Task, args: Iterable[Any], kwargs: dict[str, Any]
    ) -> TaskResult:
        self.check_usable()
        row, result = self._rows.call(task, args, kwargs)
        database = self.database  # the routers' answer, asked once per call
        if database in self._packet_limits:
            limit = self._packet_limits[database]
        else:
            limit = await sync_to_async(self._packet_limit)(database)
        rows.check_packet([row], limit)
        if row.dedupe_key is not None:
            deduplicated: TaskResult = await sync_to_async(self._enqueue_deduplicated)(row, result)
            return deduplicated
        if subject_of_task(task) is not None:  # two statements: not for the shared INSERTs
            await sync_to_async(writes.write)(
                database, [row], [result], notify=self.config.notify, sender=type(self)
            )
            return result
        coalescer = await coalescer_for(self)
        try:
            await coalescer.submit(row, result)
        except Exception as e:
            if not installation.is_missing_table(e):
                raise
            # PostgreSQL's native writer raises the driver's error: give Django's class.
            kind = type(e) if isinstance(e, DatabaseError) else ProgrammingError
            raise kind(installation.not_migrated(database)) from e
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
        return self.store.get_result(result_id)

    async def aget_result(self, result_id: str) -> TaskResult:
        """Async ``get_result``: on the event loop itself on PostgreSQL."""
        coalescer = await coalescer_for(self)
        result: TaskResult = await coalescer.read_result(result_id)
        return result

    def wait_result(self, result_id: str, timeout: float | None = None) -> TaskResult:
        """Block until the task is SUCCESSFUL or FAILED and return its result; raise
        ``WaitTimeout`` if it has not finished within ``timeout`` seconds (None: no limit)."""
        return self.store.wait_result(result_id, timeout)

    async def await_result(self, result_id: str, timeout: float | None = None) -> TaskResult:
        """Async ``wait_result``: the wait holds no thread and no connection."""
        return await self.store.await_result(result_id, timeout)

    def cancel(self, result_id: str) -> bool:
        """Cancel a task: a READY one never runs (FAILED with ``TaskCancelled``); a RUNNING async
        one is cancelled by its worker at the next heartbeat. Return False if it had finished
        (or is a RUNNING sync task, which cannot be interrupted but is flagged all the same).
        """
        return self.store.cancel(result_id)

    async def acancel(self, result_id: str) -> bool:
        """Async ``cancel``."""
        cancelled: bool = await sync_to_async(self.cancel)(result_id)
        return cancelled

    def pause_queue(self, queue_name: str) -> bool:
        """Stop every worker claiming tasks of ``queue_name`` (they stay READY; running ones
        finish); return False if it was paused already. Raise ``UnknownQueue`` for a name
        outside QUEUES."""
        return self.store.pause_queue(queue_name)

    def resume_queue(self, queue_name: str) -> bool:
        """Let workers claim tasks of ``queue_name`` again; return False if it was not paused."""
        return self.store.resume_queue(queue_name)

    def set_queue_limit(
        self, queue_name: str, *, concurrency: int | None = None, rate: str | None = None
    ) -> bool:
        """Override ``queue_name``'s limits in QUEUE_LIMITS on every worker (from its next
        limited claim): ``concurrency`` at least 1, ``rate`` like ``"10/s"``; one left None
        keeps the settings' one. Replace any override; return False if there was one. Raise
        ``UnknownQueue`` for a name outside QUEUES and ValueError naming a bad limit."""
        return self.store.set_queue_limit(queue_name, concurrency, rate)

    def clear_queue_limit(self, queue_name: str) -> bool:
        """Put ``queue_name``'s QUEUE_LIMITS back in force (none if it has none); return False
        if it had no override."""
        return self.store.clear_queue_limit(queue_name)

    def queue_limits(self) -> list[Any]:
        """Return each limited queue's ``QueueLimitState``: its limits from QUEUE_LIMITS, its
        override and those in force, by queue name."""
        return self.store.queue_limits()

    def paused_queues(self) -> list[str]:
        """Return the names of this backend's paused queues, sorted."""
        return self.store.paused_queues()

    def run_now(self, result_id: str) -> bool:
        """Make a deferred READY task due now, by the database's clock; return False if it is
        not READY (a task due already stays where it is, and True is returned). Raise
        ``TaskResultDoesNotExist`` for an unknown id."""
        return self.store.run_now(result_id)

    def enqueue_workflow(
        self, root: Node, tasks: StepCalls, args: list[Any], kwargs: dict[str, Any]
    ) -> WorkflowResult:
        """Write a workflow (``chain(...).enqueue()``) and all its tasks, in the caller's
        transaction."""
        return self.store.enqueue_workflow(root, tasks, args, kwargs)

    def get_workflow(self, workflow_id: str) -> WorkflowResult:
        """The workflow ``workflow_id``; raise ``LookupError`` naming it if there is none."""
        return self.store.get_workflow(workflow_id)

    def workflow_of(self, result_id: str) -> WorkflowResult | None:
        """The workflow whose step task ``result_id`` is; None if none (or it was pruned)."""
        return self.store.workflow_of(result_id)

    def cancel_workflow(self, workflow_id: str) -> bool:
        """Stop a workflow's steps that have not run; False if it had finished."""
        return self.store.cancel_workflow(workflow_id)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        return list(check_backend(self, engine_vendor))
