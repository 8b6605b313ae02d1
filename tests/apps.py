"""The test suite's app: in a worker process a test started, it sends the events the test
waits on (see ``tests.events``)."""

from __future__ import annotations

import os

from django.apps import AppConfig


class TestsConfig(AppConfig):
    name = "tests"

    def ready(self) -> None:
        path = os.environ.get("SQLTASKS_TEST_EVENTS")
        if not path:
            return
        # Only in a test's worker process: the worker package, and its models, load here.
        from django_sqltasks.worker import events

        from .events import Sender, connect_task_signals

        events.listener = Sender(path)
        connect_task_signals()
