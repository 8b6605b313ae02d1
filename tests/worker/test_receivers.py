"""Sending task_started and task_finished: Django's logging receivers are left out of a send
only where their logger drops what they would log."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_sqltasks import SQLTaskBackend
from django_sqltasks.compat import TASKS_LOGGER, TaskResultStatus, task_finished, task_started
from django_sqltasks.worker import Worker
from django_sqltasks.worker.receivers import Receivers
from tests import tasks

RunWorker = Callable[..., Worker]


@pytest.fixture
def tasks_logger_at_warning() -> Iterator[logging.Logger]:
    """Django's tasks logger as tasks_worker leaves it by default without DEBUG."""
    logger = logging.getLogger(TASKS_LOGGER)
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield logger
    logger.setLevel(level)


def test_djangos_logging_receivers_alone_are_idle_when_their_logger_drops_info(
    tasks_logger_at_warning: logging.Logger,
) -> None:
    assert Receivers(task_started, SQLTaskBackend).idle
    assert Receivers(task_finished, SQLTaskBackend).idle
    tasks_logger_at_warning.setLevel(logging.INFO)
    assert not Receivers(task_started, SQLTaskBackend).idle
    assert not Receivers(task_finished, SQLTaskBackend).idle


def test_a_receiver_of_the_project_keeps_a_signal_acting(
    tasks_logger_at_warning: logging.Logger,
) -> None:
    def on_finished(sender: Any, **kwargs: Any) -> None:
        pass

    task_finished.connect(on_finished)
    try:
        assert not Receivers(task_finished, SQLTaskBackend).idle
    finally:
        task_finished.disconnect(on_finished)


@pytest.mark.django_db(transaction=True)
def test_with_info_dropped_a_receiver_still_gets_each_finish_and_a_failure_is_logged(
    run_worker: RunWorker,
    caplog: pytest.LogCaptureFixture,
    tasks_logger_at_warning: logging.Logger,
) -> None:
    finished: dict[str, str] = {}

    def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished[task_result.id] = task_result.status

    ok = tasks.add.enqueue(1, 2)
    bad = tasks.fail.enqueue("logged")
    task_finished.connect(on_finished)
    try:
        run_worker()
    finally:
        task_finished.disconnect(on_finished)
    assert finished == {ok.id: TaskResultStatus.SUCCESSFUL, bad.id: TaskResultStatus.FAILED}
    # Django's receiver logs the failure at ERROR, which its logger still takes.
    logged = [r for r in caplog.records if r.name == TASKS_LOGGER]
    assert [(r.levelno, bad.id in r.getMessage()) for r in logged] == [(logging.ERROR, True)]


@pytest.mark.django_db(transaction=True)
def test_with_only_idle_receivers_a_failure_is_still_logged_once(
    run_worker: RunWorker,
    caplog: pytest.LogCaptureFixture,
    tasks_logger_at_warning: logging.Logger,
) -> None:
    ok = tasks.add.enqueue(1, 2)
    bad = tasks.fail.enqueue("logged")
    run_worker()
    assert tasks.add.get_result(ok.id).status == TaskResultStatus.SUCCESSFUL
    failures = [r for r in caplog.records if r.exc_info and bad.id in r.getMessage()]
    assert [(r.name, r.levelno) for r in failures] == [(TASKS_LOGGER, logging.ERROR)]
