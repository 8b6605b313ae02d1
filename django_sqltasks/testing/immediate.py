"""A backend for tests that runs each task as it is enqueued, with every ``@task`` option."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

from asgiref.sync import sync_to_async

from ..backend import SQLTaskBackend
from ..compat import Task, TaskResult
from .runner import run_tasks

_local = threading.local()  # .running: this thread is inside run_tasks() of an enqueue


class ImmediateSQLTaskBackend(SQLTaskBackend):
    """Write each task as ``SQLTaskBackend`` does, then run it at once in this process.

    It keeps this backend's ``@task`` options (retries, backoff, timeout, dedupe), which
    Django's ImmediateBackend refuses, and stores every task, so ``get_result`` works. Every
    due task runs, deferred ones and retries included (the queue's clock moves forward to
    them), before ``enqueue`` returns the finished result. A task enqueued by a running task
    runs after it, not inside it.
    """

    def enqueue(self, task: Task, args: Iterable[Any], kwargs: dict[str, Any]) -> TaskResult:
        result = super().enqueue(task, args, kwargs)
        if self._run_all():
            return self.get_result(result.id)
        return result

    def enqueue_many(
        self, task: Task, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]]
    ) -> list[TaskResult]:
        results = super().enqueue_many(task, calls)
        if self._run_all():
            return [self.get_result(result.id) for result in results]
        return results

    async def aenqueue(self, task: Task, args: Iterable[Any], kwargs: dict[str, Any]) -> TaskResult:
        result: TaskResult = await sync_to_async(self.enqueue)(task, args, kwargs)
        return result

    def _run_all(self) -> bool:
        """Run every task, unless a task being run enqueued this one (the outer run will)."""
        if getattr(_local, "running", False):
            return False
        _local.running = True
        try:
            run_tasks(backend=self.alias, fast_forward=True)
        finally:
            _local.running = False
        return True
