"""manage.py tasks_check: live tasks this code could not run, found before a deploy."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_sqltasks.compat import TaskResultStatus
from tests.factories import task_row

pytestmark = pytest.mark.django_db(transaction=False)


def check(*args: str) -> str:
    out = StringIO()
    call_command("tasks_check", *args, stdout=out)
    return out.getvalue()


def check_fails(*args: str) -> tuple[str, str]:
    out = StringIO()
    with pytest.raises(CommandError) as failure:
        call_command("tasks_check", *args, stdout=out)
    assert failure.value.returncode == 1
    return out.getvalue(), str(failure.value)


def test_no_problem() -> None:
    task_row(args=[1, 2])
    task_row(TaskResultStatus.RUNNING, args=[], kwargs={"a": 1, "b": 2})
    task_row(task_path="tests.tasks.context_info", args=["label"])  # the context comes first
    # Finished tasks are not checked: they never run again.
    task_row(TaskResultStatus.FAILED, task_path="tests.tasks.gone")
    assert check() == (
        "Checked 3 live task(s) of 2 task path(s); the arguments of 3 of them were bound (up "
        "to 100 per task path: --sample). No problem found.\n"
    )


def test_a_path_that_no_longer_imports() -> None:
    ready = task_row(task_path="tests.tasks.renamed_away")
    running = task_row(TaskResultStatus.RUNNING, task_path="tests.tasks.renamed_away")
    task_row(task_path="tests.tasks.NOT_A_TASK")
    out, error = check_fails()
    lines = out.splitlines()
    assert lines[0].split() == ["backend", "task", "ready", "running", "example", "id", "problem"]
    assert "tests.tasks.NOT_A_TASK" in lines[1]
    assert "names an int, not a Task" in lines[1]
    assert lines[2].split()[:4] == ["default", "tests.tasks.renamed_away", "1", "1"]
    assert "does not import" in lines[2]
    assert lines[2].split()[4] in {str(ready.id), str(running.id)}
    assert "2 task path(s) would strand 3 live task(s)" in error


def test_arguments_that_no_longer_bind() -> None:
    bad = task_row(args=[1])  # add(a, b): b is missing
    task_row(args=[1, 2])
    also_bad = task_row(kwargs={"a": 1, "c": 3}, args=[])  # b missing too
    task_row(task_path="tests.tasks.context_info", args=[])
    out, error = check_fails()
    [add_line] = [line for line in out.splitlines() if "tests.tasks.add " in line]
    assert "the arguments of 2 of 3 sampled task(s) no longer bind to add(a, b)" in add_line
    assert "missing a required argument: 'b'" in add_line
    # The example is the first failure the sample read, which reads in no order (a sort of
    # every live row of the path would cost more than the check): either of the two.
    assert str(bad.id) in add_line or str(also_bad.id) in add_line
    [context_line] = [line for line in out.splitlines() if "context_info" in line]
    assert "missing a required argument: 'label'" in context_line
    assert "2 task path(s) would strand 4 live task(s)" in error


def test_the_sample_bounds_the_rows_read() -> None:
    for _ in range(4):
        task_row(args=[1])
    task_row(task_path="tests.tasks.noop", args=[])
    out, error = check_fails("--sample", "2")
    assert "the arguments of 2 of 2 sampled task(s) no longer bind" in out
    assert "Checked 5 live task(s) of 2 task path(s); the arguments of 3 of them" in error
    assert "up to 2 per task path" in error
    assert "1 task path(s) would strand 4 live task(s)" in error


def test_queue_and_backend_limit_the_check() -> None:
    task_row(task_path="tests.tasks.gone", queue_name="other")
    assert "No problem found" in check("-Q", "default")
    assert "No problem found" in check("--queue", "default,slow", "--backend", "default")
    check_fails("-Q", "default", "-Q", "other")
    check_fails("-Q", "*")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "immediate"], "--backend: 'immediate' is not a django_sqltasks backend"),
        (["--backend", "nope"], "--backend: 'nope' is not a django_sqltasks backend"),
        (["-Q", "nope"], "--queue: 'nope' is not a queue of backend 'default'"),
        (["--sample", "0"], "must be at least 1"),
        (["-Q", "a\x00b"], "must not contain control characters"),
        (["-Q", "\udcff"], "must be valid UTF-8 text"),
    ],
)
def test_bad_input(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message.replace("*", r"\*")):
        call_command("tasks_check", *args, stdout=StringIO())
