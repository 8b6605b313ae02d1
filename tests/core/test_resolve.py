"""Turning a task path into a task: a task a worker would not import is refused at enqueue."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps

from django_sqltasks.compat import InvalidTask
from django_sqltasks.models import TaskRecord
from tests import tasks
from tests.conftest import set_backend_options


@pytest.mark.django_db
def test_a_task_outside_the_installed_apps_is_refused_at_enqueue_not_in_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """A new project's first task often lands in the project package (mysite/tasks.py), which
    is no installed app: a worker would not import it."""
    package = tmp_path / "newproject"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(
        "from django_sqltasks.compat import task\n\n\n@task\ndef hello() -> str:\n    return 'hi'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "newproject.tasks", raising=False)
    hello = importlib.import_module("newproject.tasks").hello
    with pytest.raises(InvalidTask, match="which a worker does not import") as info:
        hello.enqueue()
    assert "OPTIONS['TASK_MODULES']" in str(info.value)
    assert not TaskRecord.objects.exists()
    set_backend_options(settings, TASK_MODULES=["newproject", "tests"])
    assert importlib.import_module("newproject.tasks").hello.enqueue().status == "READY"


@pytest.mark.django_db
def test_a_task_of_an_app_a_tests_available_apps_leaves_out_is_enqueued() -> None:
    """Django's TransactionTestCase.available_apps narrows the app registry for one test; the
    project's workers still import every installed app, so its tasks are enqueued meanwhile."""
    apps.set_available_apps(["django.contrib.contenttypes", "django_sqltasks"])
    try:
        # A task no other test enqueues: an enqueue's checks are remembered per task.
        result = tasks.enqueued_while_apps_are_narrowed.enqueue()
    finally:
        apps.unset_available_apps()
    assert (
        TaskRecord.objects.get(pk=result.id).task_path
        == "tests.tasks.enqueued_while_apps_are_narrowed"
    )
