"""One attempt at a claimed task: its resolved task, its ``TaskResult`` and its policy (how it
ends is ``outcomes``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from dataclasses import dataclass, field, fields
from functools import lru_cache
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any

from ..compat import Task, TaskContext, TaskResult, TaskResultStatus
from ..core.policy import Policy, policy_for
from ..core.progress import AttemptReport, ReportSink, SQLTaskContext
from ..core.resolve import resolve_task
from ..exceptions import CorruptTask, TaskTimeout
from ..sql import ClaimedRow
from ..store.waits import AttemptSteps
from ..task import RESULT_FIELDS, errors_from_json, rebind_task

if TYPE_CHECKING:
    from ..core.options import BackendOptions

# Frames a task's traceback starts with that are ours or asyncio's, not the task's own.
_RUNNER_DIRS = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep,
)
_settle_lock = threading.Lock()
# (task, id(options)) -> (options, policy): the options are held, so their id is not reused.
_policies: dict[tuple[Task, int], tuple[BackendOptions, Policy]] = {}
MAX_POLICIES = 4096  # distinct (task, options) pairs cached; the cache restarts beyond
# (task_path, backend, priority, queue_name) -> (options, task, policy): the task a row's path
# resolved to, rebound to those stored options, and its policy under the options held. Only a
# path that resolved (through the trust boundary of core/resolve.py, and check_backend) is
# kept, and other options (a backend built again, with other settings) miss.
_prepared: dict[tuple[str, str, int, str], tuple[BackendOptions, Task, Policy]] = {}
MAX_PREPARED = 4096  # distinct keys cached; the cache restarts beyond
_DIRECT_RESULT = tuple(f.name for f in fields(TaskResult)) == RESULT_FIELDS
_new_object = object.__new__
_set_field = object.__setattr__


@dataclass(slots=True)
class Attempt:
    """A claimed task ready to run: its row, its resolved Task and its TaskResult."""

    row: ClaimedRow
    task: Task
    result: TaskResult
    policy: Policy
    settled: bool = field(default=False)
    # What the task reports through its context (takes_context=True tasks only).
    report: AttemptReport | None = None

    def settle(self) -> bool:
        """Return True to the first caller only: the task ending, or its timeout firing."""
        with _settle_lock:
            if self.settled:
                return False
            self.settled = True
            return True

    def call_args(
        self, reports: ReportSink | None = None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The function's arguments; a context first for ``takes_context`` tasks, whose
        reports go to ``reports``."""
        args: tuple[Any, ...] = tuple(self.result.args)
        if self.task.takes_context:
            row = self.row
            self.report = AttemptReport(
                row.id,
                len(row.worker_ids),
                reports,
                claims=row.attempts,
                labels=(row.backend_name, row.queue_name, row.task_path),
            )
            steps = AttemptSteps(
                task_id=row.id,
                owner=row.worker_ids[-1],
                attempt=row.attempts,
                claims=len(row.worker_ids),
                backend_name=row.backend_name,
            )
            context: TaskContext = SQLTaskContext(
                task_result=self.result, report=self.report, steps=steps
            )
            args = (context, *args)
        return args, self.result.kwargs

    async def call_async(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Await an ``async def`` task's function; past its timeout, cancel it, let it unwind,
        and raise ``TaskTimeout``."""
        timeout = self.policy.timeout
        if timeout is None:
            return await self.task.func(*args, **kwargs)
        job = asyncio.ensure_future(self.task.func(*args, **kwargs))
        try:
            done, _ = await asyncio.wait({job}, timeout=timeout)
        except asyncio.CancelledError:
            job.cancel()
            raise
        if not done:
            job.cancel()
            with contextlib.suppress(BaseException):
                await job
            raise self.timed_out()
        return job.result()

    def timed_out(self) -> TaskTimeout:
        """The error of this attempt once it has run past its timeout."""
        return TaskTimeout(f"The task ran longer than its timeout of {self.policy.timeout}s.")


def is_async(task: Task) -> bool:
    """Whether ``task`` is an ``async def`` function, to run on the event loop."""
    try:
        return _is_coroutine(task.func)
    except TypeError:  # an unhashable callable
        return iscoroutinefunction(task.func)


# A look-up per claimed task: ``iscoroutinefunction`` costs 1 us, a cached answer 0.1 us.
_is_coroutine = lru_cache(maxsize=1024)(iscoroutinefunction)


def prepare(row: ClaimedRow, config: BackendOptions) -> Attempt:
    """Resolve the row's task and build its RUNNING ``TaskResult``; raise ``TaskNotFound``
    or ``CorruptTask``."""
    if row.corrupt is not None:
        raise CorruptTask(f"The stored task cannot be run: {row.corrupt}.")
    task, policy = _task_and_policy(row, config)
    return Attempt(row=row, task=task, result=running_result(row, task), policy=policy)


def running_result(row: ClaimedRow, task: Task) -> TaskResult:
    """The RUNNING ``TaskResult`` of ``row``'s attempt at ``task``."""
    errors = errors_from_json(row.errors) if row.errors else []
    if not _DIRECT_RESULT:
        result: TaskResult = TaskResult(
            task=task,
            id=row.text_id or str(row.id),
            status=TaskResultStatus.RUNNING,
            enqueued_at=row.enqueued_at,
            started_at=row.started_at,
            finished_at=None,
            last_attempted_at=row.last_attempted_at,
            args=[],
            kwargs={},
            backend=row.backend_name,
            errors=errors,
            worker_ids=row.worker_ids,
        )
        # Decoded from JSON, the arguments are normalized already: TaskResult would walk
        # them again (normalize_json) if they were passed to it.
        object.__setattr__(result, "args", row.args)
        object.__setattr__(result, "kwargs", row.kwargs)
        return result
    # The same fields set without TaskResult.__init__ (5 us against 13: its __post_init__
    # walks the arguments, and each keyword costs), while its fields are the ones set here.
    result = _new_object(TaskResult)
    _set_field(result, "task", task)
    _set_field(result, "id", row.text_id or str(row.id))
    _set_field(result, "status", TaskResultStatus.RUNNING)
    _set_field(result, "enqueued_at", row.enqueued_at)
    _set_field(result, "started_at", row.started_at)
    _set_field(result, "finished_at", None)
    _set_field(result, "last_attempted_at", row.last_attempted_at)
    _set_field(result, "args", row.args)
    _set_field(result, "kwargs", row.kwargs)
    _set_field(result, "backend", row.backend_name)
    _set_field(result, "errors", errors)
    _set_field(result, "worker_ids", row.worker_ids)
    _set_field(result, "_return_value", None)
    return result


def _task_and_policy(row: ClaimedRow, config: BackendOptions) -> tuple[Task, Policy]:
    """The row's task, rebound to its stored options, and its policy: resolved once per path
    and options (some 5 us a task otherwise: the path checked and split, the task copied)."""
    key = (row.task_path, row.backend_name, row.priority, row.queue_name)
    cached = _prepared.get(key) if row.run_after is None else None
    if cached is not None and cached[0] is config:
        return cached[1], cached[2]
    task = rebind_task(
        resolve_task(row.task_path),
        priority=row.priority,
        queue_name=row.queue_name,
        run_after=row.run_after,
        backend=row.backend_name,
    )
    policy = _policy(task, config)
    if row.run_after is None:  # a deferred row's own time would only fill the cache
        if len(_prepared) >= MAX_PREPARED:
            _prepared.clear()
        _prepared[key] = (config, task, policy)
    return task, policy


def forget_tasks() -> None:
    """Resolve every path again from now on (a test that unloads a task module calls this)."""
    _prepared.clear()
    _policies.clear()


def _policy(task: Task, config: BackendOptions) -> Policy:
    """``policy_for``, computed once per task and options."""
    key = (task, id(config))
    try:
        cached = _policies.get(key)
    except TypeError:  # a task with an unhashable option
        return policy_for(task, config)
    if cached is not None and cached[0] is config:
        return cached[1]
    if len(_policies) >= MAX_POLICIES:
        _policies.clear()
    policy = policy_for(task, config)
    _policies[key] = (config, policy)
    return policy


def from_task_frame(exc: BaseException) -> BaseException:
    """``exc`` with the worker's own frames taken off the start of its traceback, so that it
    starts at the task's frame (where the task raised; a worker error keeps its frames)."""
    tb = exc.__traceback__
    first = tb
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_RUNNER_DIRS):
        tb = tb.tb_next
    if tb is not None and tb is not first:
        exc.__traceback__ = tb
    return exc
