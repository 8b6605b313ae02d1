"""Reading rows no enqueue of today's code would write: a task path that no longer imports, a
task of another backend, values nested too deep for Python. get_result returns what is stored."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection

from django_sqltasks.compat import TaskResultStatus, task_backends
from django_sqltasks.core.serialization import MAX_DEPTH
from django_sqltasks.exceptions import InvalidTaskArguments, TaskNotFound
from django_sqltasks.models import TaskRecord
from django_sqltasks.task import CUT_MARKER, MAX_READ_DEPTH, MissingTask
from tests import tasks
from tests.factories import task_row

pytestmark = pytest.mark.django_db


def nest(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


def depth(value: Any) -> tuple[int, Any]:
    """How many lists deep ``value`` goes, and what is at the bottom."""
    levels = 0
    while isinstance(value, list) and value:
        value, levels = value[0], levels + 1
    return levels, value


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("task_path", "reason"),
    [
        pytest.param("tests.tasks.renamed_long_ago", "does not import", id="gone function"),
        pytest.param("old_app.tasks.report", "module 'old_app.tasks' is not loaded", id="gone app"),
        pytest.param("tests.tasks.NOT_A_TASK", "not a Task", id="not a task"),
        pytest.param(
            "tests.tasks_hardening.on_immediate", "declared for backend 'immediate'", id="other"
        ),
    ],
)
@pytest.mark.parametrize("status", [TaskResultStatus.FAILED, TaskResultStatus.SUCCESSFUL, "READY"])
def test_a_stale_row_reads_back_with_a_stand_in_task(
    task_path: str, reason: str, status: str
) -> None:
    record = task_row(status, task_path=task_path, args=[1, {"a": "b"}], kwargs={"k": 2})
    backend = task_backends["default"]
    for result in (backend.get_result(str(record.id)), record.task_result):
        assert isinstance(result.task, MissingTask)
        assert result.task.module_path == task_path
        assert result.task.name == task_path.rpartition(".")[2]
        assert reason in result.task.reason
        assert result.status == status
        assert result.args == [1, {"a": "b"}] and result.kwargs == {"k": 2}
        assert result.backend == "default"
        if status == TaskResultStatus.FAILED:
            assert result.errors[0].exception_class_path == "builtins.ValueError"
        if status == TaskResultStatus.SUCCESSFUL:
            assert result.return_value == 3
    with pytest.raises(TaskNotFound, match=reason):
        result.task.enqueue()
    with pytest.raises(TaskNotFound, match=reason):
        result.task.call()
    assert TaskRecord.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_stale_row_reads_back_from_async_code() -> None:
    record = task_row(TaskResultStatus.FAILED, task_path="gone.module.task")
    result = async_to_sync(task_backends["default"].aget_result)(str(record.id))
    assert isinstance(result.task, MissingTask)
    assert result.status == TaskResultStatus.FAILED
    result.refresh()  # through the stand-in's backend
    assert result.errors[0].exception_class_path == "builtins.ValueError"


@pytest.mark.parametrize("column", ["args", "kwargs"])
def test_arguments_nested_999_deep_are_cut_not_a_recursion_error(column: str) -> None:
    """999 levels: the deepest SQLite's JSON holds (it stops at 1000), past Python's recursion
    limit for Django's TaskResult, which walks the arguments recursively."""
    if connection.vendor == "mysql" and connection.mysql_is_mariadb:
        pytest.skip("MariaDB's JSON refuses documents over 31 levels deep: no such row exists")
    value = {"args": [nest(998)], "kwargs": {"deep": nest(998)}}[column]
    # Storing it through the ORM encodes it with the json module, recursively: give the test's
    # own write the stack room (the read under test must do without).
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + 2000)
    try:
        record = task_row(
            TaskResultStatus.SUCCESSFUL,
            task_path="tests.tasks.echo",
            return_value=nest(999),
            **{column: value},
        )
    finally:
        sys.setrecursionlimit(limit)
    result = task_backends["default"].get_result(str(record.id))
    assert result.status == TaskResultStatus.SUCCESSFUL
    if sys.version_info < (3, 12) and result.return_value == CUT_MARKER:
        # Before Python 3.12, Django's JSON decoding recurses past the limit on this row: each
        # column it cannot decode is read alone and stands as the marker (undecodable_row).
        assert result.args == [CUT_MARKER] or result.kwargs == {"cut": CUT_MARKER}
        return
    inner = result.args[0] if column == "args" else result.kwargs["deep"]
    # Cut where MAX_READ_DEPTH levels (counting the args list or kwargs dict) are reached.
    assert depth(inner) == (MAX_READ_DEPTH - 1, CUT_MARKER)
    assert depth(result.return_value) == (MAX_READ_DEPTH, CUT_MARKER)


def test_a_value_nested_within_the_enqueue_limit_is_never_cut() -> None:
    deepest = nest(MAX_DEPTH)  # MAX_DEPTH lists: with the args list, 31 levels on MariaDB
    result = tasks.echo.enqueue(deepest)
    assert task_backends["default"].get_result(result.id).args == [deepest]
    with pytest.raises(InvalidTaskArguments, match=f"nested more than {MAX_DEPTH} levels deep"):
        tasks.echo.enqueue([deepest])


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="only PostgreSQL's jsonb stores 12,000 levels"
)
def test_json_too_deep_for_python_to_decode_reads_back_flagged() -> None:
    record = task_row(task_path="tests.tasks.echo", kwargs={"k": 1})
    deep = "[" * 12_000 + "1" + "]" * 12_000
    with connection.cursor() as cursor:  # past the ORM, which could not encode it either
        cursor.execute(
            f"UPDATE {TaskRecord._meta.db_table} SET args = %s::jsonb WHERE id = %s",
            [deep, record.id],
        )
    result = task_backends["default"].get_result(str(record.id))
    assert result.args == [CUT_MARKER]
    assert result.kwargs == {"k": 1}
    assert result.status == TaskResultStatus.READY
