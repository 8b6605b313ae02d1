"""Django's Tasks API as Django's own tests use it: results that pickle and copy,
``task.using(backend=...)``, arguments bound at enqueue, Django's errors from ``aenqueue``,
and ``tasks_prune --queue '*'`` (see docs/guarantees.md, "Django's own tests")."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection, connections

from django_sqltasks.compat import InvalidTask, TaskResultStatus, task_backends
from django_sqltasks.core.progress import ProgressReport
from django_sqltasks.exceptions import InvalidTaskArguments
from django_sqltasks.models import TaskRecord
from django_sqltasks.task import MissingTask
from django_sqltasks.testing import run_tasks
from django_sqltasks.worker import Worker
from tests import tasks
from tests.conftest import set_backend_options
from tests.factories import task_row

RunWorker = Callable[..., Worker]


def round_trips(result: Any) -> None:
    """``result`` survives pickle, copy, deepcopy and dataclasses.asdict unchanged."""
    assert pickle.loads(pickle.dumps(result)) == result
    assert copy.copy(result) == result
    assert copy.deepcopy(result) == result
    assert dataclasses.asdict(result) == dataclasses.asdict(copy.deepcopy(result))


@pytest.mark.django_db
def test_an_enqueued_result_pickles_and_copies() -> None:
    round_trips(tasks.add.enqueue(1, 2))


@pytest.mark.django_db
def test_a_result_with_metadata_pickles_and_copies_and_its_metadata_stays_read_only() -> None:
    report = ProgressReport(attempt=1, progress=0.5, note="half", metadata={"pages": [1, 2]})
    row = task_row(
        TaskResultStatus.RUNNING, attempts=1, worker_ids=["w1"], progress=report.to_json()
    )
    result = tasks.add.get_result(str(row.pk))
    assert result.metadata == {"pages": [1, 2]}
    round_trips(result)
    assert pickle.loads(pickle.dumps(result)).metadata == {"pages": [1, 2]}
    assert dataclasses.asdict(result)["metadata"] == {"pages": [1, 2]}
    with pytest.raises(TypeError, match="metadata is read-only"):
        result.metadata["pages"] = []


@pytest.mark.django_db
def test_the_result_of_a_task_that_no_longer_resolves_pickles() -> None:
    row = task_row(TaskResultStatus.SUCCESSFUL, task_path="tests.tasks.renamed_long_ago")
    result = task_backends["default"].get_result(str(row.pk))
    assert isinstance(result.task, MissingTask)
    again = pickle.loads(pickle.dumps(result))
    assert again == result and again.task.task_path == "tests.tasks.renamed_long_ago"


@pytest.mark.django_db(transaction=True)
async def test_a_refreshed_result_is_unchanged_as_a_dict() -> None:
    result = await tasks.add.aenqueue(1, 2)
    before = dataclasses.asdict(result)
    await result.arefresh()
    assert dataclasses.asdict(result) == before


@pytest.fixture
def second_backend(settings: Any) -> str:
    """A second django-sqltasks backend keeping its tasks in the same database."""
    settings.TASKS = {**settings.TASKS, "second": {**settings.TASKS["default"]}}
    return "second"


@pytest.mark.django_db(transaction=True)
def test_using_another_backend_enqueues_through_it_and_only_its_workers_run_the_row(
    second_backend: str, run_worker: RunWorker
) -> None:
    task = tasks.add.using(backend=second_backend)
    assert task.backend == second_backend
    result = task.enqueue(2, 3)
    assert result.backend == second_backend
    assert TaskRecord.objects.get().backend_name == second_backend
    assert task.get_result(result.id).task.backend == second_backend
    run_worker(backend="default")
    assert TaskRecord.objects.get().status == TaskResultStatus.READY  # not default's row
    run_worker(backend=second_backend)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5
    assert result.task.backend == second_backend


@pytest.mark.django_db(transaction=True)
def test_using_a_backend_of_another_database_is_refused_and_such_a_row_never_runs(
    settings: Any, run_worker: RunWorker
) -> None:
    elsewhere = {**settings.TASKS["default"]}
    elsewhere["OPTIONS"] = {**elsewhere["OPTIONS"], "DATABASE": "elsewhere"}
    settings.TASKS = {**settings.TASKS, "elsewhere": elsewhere}
    with pytest.raises(InvalidTask, match="whose tasks are in database 'default'"):
        tasks.add.using(backend="elsewhere")
    # A row of 'default' naming a task declared for Django's own ImmediateBackend.
    row = task_row(task_path="tests.tasks_hardening.on_immediate", args=[])
    run_worker(backend="default")
    row.refresh_from_db()
    assert row.status == TaskResultStatus.FAILED
    assert row.errors[0]["exception_class_path"].endswith("TaskBackendMismatch")
    assert "which is not a django-sqltasks backend" in row.errors[0]["traceback"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("task", "good", "args", "kwargs", "message"),
    [
        (tasks.add, [1, 2], [1], {}, "missing a required argument: 'b'"),
        (tasks.add, [1, 2], [1, 2, 3], {}, "too many positional arguments"),
        (tasks.add, [1, 2], [1, 2], {"c": 3}, "got an unexpected keyword argument 'c'"),
        (tasks.context_info, ["x"], [], {}, "missing a required argument: 'label'"),
    ],
)
def test_arguments_that_do_not_fit_the_function_are_refused_at_enqueue(
    task: Any, good: list[Any], args: list[Any], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidTaskArguments, match=message) as info:
        task.enqueue(*args, **kwargs)
    assert task.module_path in str(info.value)
    with pytest.raises(TypeError, match=r"calls\[1\]: .*" + message):
        task_backends["default"].enqueue_many(task, [(good, {}), (args, kwargs)])
    assert not TaskRecord.objects.exists()
    assert task.enqueue(*good).args == good


@pytest.mark.django_db(transaction=True)
async def test_aenqueue_binds_its_arguments_too() -> None:
    with pytest.raises(InvalidTaskArguments, match="missing a required argument: 'b'"):
        await tasks.add.aenqueue(1)  # type: ignore[call-arg]
    assert (await tasks.context_info.aenqueue("label")).args == ["label"]


@pytest.fixture
def unreachable(settings: Any) -> Iterator[None]:
    """The default backend's tasks in a database nothing listens for."""
    connections.settings["unreachable"] = {**connection.settings_dict, "PORT": 1}
    set_backend_options(settings, DATABASE="unreachable")
    try:
        yield
    finally:
        del connections.settings["unreachable"]
        if hasattr(connections._connections, "unreachable"):
            delattr(connections._connections, "unreachable")


# Elsewhere aenqueue writes through Django's own connection, which raises Django's errors.
@pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg's writer on the loop")
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("unreachable")
async def test_aenqueue_to_an_unreachable_database_raises_djangos_error() -> None:
    with pytest.raises(OperationalError) as info:
        await tasks.add.aenqueue(1, 2)
    assert type(info.value).__module__ == "django.db.utils"
    assert type(info.value.__cause__).__module__.startswith("psycopg")


@pytest.mark.django_db
def test_prune_queue_star_means_every_queue() -> None:
    for queue in ("default", "other"):
        task_row(TaskResultStatus.SUCCESSFUL, queue_name=queue, finished_ago=timedelta(days=20))
    out = StringIO()
    call_command("tasks_prune", "--queue", "*", stdout=out)
    assert not TaskRecord.objects.exists(), out.getvalue()


@pytest.mark.django_db
def test_run_tasks_fails_a_task_interrupted_by_ctrl_c_and_stops() -> None:
    """In the test's process Ctrl-C reaches the task's frame as KeyboardInterrupt: the task is
    stored FAILED, as a worker would store it, and the interrupt goes on (Django's
    ImmediateBackend raises it too)."""
    result = tasks.raise_keyboard_interrupt.enqueue()
    with pytest.raises(KeyboardInterrupt):
        run_tasks()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "builtins.KeyboardInterrupt"
