"""One attempt at a claimed task: its resolved task, its ``TaskResult`` and its policy (how it
ends is ``outcomes``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any

from ..compat import Task, TaskContext, TaskResult, TaskResultStatus
from ..core.policy import Policy, policy_for
from ..core.progress import AttemptReport, ReportSink, SQLTaskContext
from ..core.resolve import resolve_task
from ..exceptions import CorruptTask, TaskTimeout
from ..sql import ClaimedRow
from ..task import errors_from_json, rebind_task

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
            context: TaskContext = SQLTaskContext(task_result=self.result, report=self.report)
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
    task = rebind_task(
        resolve_task(row.task_path),
        priority=row.priority,
        queue_name=row.queue_name,
        run_after=row.run_after,
        backend=row.backend_name,
    )
    result: TaskResult = TaskResult(
        task=task,
        id=str(row.id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=row.enqueued_at,
        started_at=row.started_at,
        finished_at=None,
        last_attempted_at=row.last_attempted_at,
        args=[],
        kwargs={},
        backend=row.backend_name,
        errors=errors_from_json(row.errors),
        worker_ids=row.worker_ids,
    )
    # Decoded from JSON, the arguments are normalized already: TaskResult would walk them
    # again (normalize_json) if they were passed to it.
    object.__setattr__(result, "args", row.args)
    object.__setattr__(result, "kwargs", row.kwargs)
    return Attempt(row=row, task=task, result=result, policy=_policy(task, config))


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
