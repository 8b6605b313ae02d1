"""Capturing the tasks a test enqueues, and asserting on them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

from ..compat import Task, TaskResult, task_enqueued

try:
    from django.utils.json import normalize_json
except ImportError:  # pragma: no cover - Django 5.2 with the backport
    from django_tasks.utils import normalize_json  # type: ignore[no-redef]

_ANY: Any = object()  # a filter left out: any value matches


class CapturedTasks(list[TaskResult]):
    """The tasks enqueued while capturing, oldest first, as ``TaskResult`` objects.

    Each is the result the enqueue returned: its status is the one it had then (READY). A
    deduplicated enqueue that returned a live task enqueued nothing, so it is not captured.
    """

    def of(
        self,
        task: Task,
        *,
        args: Sequence[Any] = _ANY,
        kwargs: Mapping[str, Any] = _ANY,
        queue: str = _ANY,
        priority: int = _ANY,
        backend: str = _ANY,
    ) -> list[TaskResult]:
        """Return the captured calls of ``task`` that match every filter given."""
        if not isinstance(task, Task):
            raise TypeError(f"task must be a Task (a function decorated with @task), not {task!r}.")
        wanted: dict[str, Any] = {"queue_name": queue, "priority": priority, "backend": backend}
        if args is not _ANY:
            wanted["args"] = normalize_json(list(args))
        if kwargs is not _ANY:
            wanted["kwargs"] = normalize_json(dict(kwargs))
        return [
            result
            for result in self
            if result.task.module_path == task.module_path
            and all(
                value is _ANY or _field(result, name) == value for name, value in wanted.items()
            )
        ]

    def assert_enqueued(
        self, task: Task, *, count: int | None = None, **filters: Any
    ) -> TaskResult:
        """Fail unless ``task`` was enqueued with the given ``args``, ``kwargs``, ``queue``,
        ``priority`` or ``backend`` (``count`` times, if given); return the first match."""
        matches = self.of(task, **filters)
        if not matches or (count is not None and len(matches) != count):
            expected = "once or more" if count is None else f"{count} time(s)"
            raise AssertionError(
                f"Expected {_call(task, filters)} to be enqueued {expected}; it was enqueued "
                f"{len(matches)} time(s). {self._listing()}"
            )
        return matches[0]

    def assert_not_enqueued(self, task: Task, **filters: Any) -> None:
        """Fail if ``task`` was enqueued with the given ``args``, ``kwargs``, ``queue``,
        ``priority`` or ``backend`` (with none given: at all)."""
        matches = self.of(task, **filters)
        if matches:
            raise AssertionError(
                f"Expected {_call(task, filters)} not to be enqueued; it was enqueued "
                f"{len(matches)} time(s). {self._listing()}"
            )

    def _listing(self) -> str:
        if not self:
            return "Nothing was enqueued."
        lines = "\n".join(f"  {_describe(result)}" for result in self)
        return f"Enqueued:\n{lines}"


C = TypeVar("C", bound=CapturedTasks)


def _field(result: TaskResult, name: str) -> Any:
    if name in ("args", "kwargs", "backend"):
        return getattr(result, name)
    return getattr(result.task, name)


def _call(task: Task, filters: Mapping[str, Any]) -> str:
    described = ", ".join(f"{name}={value!r}" for name, value in filters.items())
    return f"{task.module_path}({described})" if described else task.module_path


def _describe(result: TaskResult) -> str:
    return (
        f"{result.task.module_path}(args={result.args!r}, kwargs={result.kwargs!r}) "
        f"queue={result.task.queue_name!r} priority={result.task.priority} "
        f"backend={result.backend!r} id={result.id}"
    )


@contextlib.contextmanager
def capture_tasks() -> Iterator[CapturedTasks]:
    """Capture every task enqueued (through any backend) inside the ``with`` block.

    A task is captured when its backend sends ``task_enqueued``: at the enqueue, or, for an
    enqueue deferred to ``on_commit`` (``ENQUEUE_ON_COMMIT``), when the transaction commits.
    """
    with capturing(CapturedTasks()) as captured:
        yield captured


@contextlib.contextmanager
def capturing(captured: C) -> Iterator[C]:
    """Append each task enqueued inside the ``with`` block to ``captured``."""

    def receiver(sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
        captured.append(task_result)

    task_enqueued.connect(receiver, weak=False)
    try:
        yield captured
    finally:
        task_enqueued.disconnect(receiver)
