"""The ``sqltasks`` pytest fixture, loaded by pytest through this package's entry point."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from ..compat import TaskResult
from .capture import CapturedTasks, capturing


class TasksFixture(CapturedTasks):
    """The tasks a test enqueued (a ``CapturedTasks``), and the means to run them."""

    def run(self, **options: Any) -> list[TaskResult]:
        """``run_tasks(**options)``: run every due task in this process."""
        from .runner import run_tasks  # measured start-up cost: the worker loads only if used

        return run_tasks(**options)

    def advance(self, delta: timedelta | float, **options: Any) -> timedelta:
        """``advance(delta, **options)``: move the queue's clock forward."""
        from .runner import advance  # measured start-up cost: the worker loads only if used

        return advance(delta, **options)


@pytest.fixture
def sqltasks() -> Iterator[TasksFixture]:
    """Capture what the test enqueues; run tasks with ``sqltasks.run()`` (needs ``db``)."""
    with capturing(TasksFixture()) as fixture:
        yield fixture
