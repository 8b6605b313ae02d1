"""What a new user meets in their first hour: the admin's pages on odd rows, its messages, the
commands' output when the database is down, and the testing helpers' isolation."""

from __future__ import annotations

import importlib
import re
import sys
import uuid
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib import admin
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.http import HttpRequest, JsonResponse
from django.test import Client
from django.urls import path, reverse
from django.utils import timezone

from django_sqltasks import chain
from django_sqltasks.compat import InvalidTask, TaskResultStatus, task_backends
from django_sqltasks.core.workflow_plan import SKIPPED
from django_sqltasks.models import TaskRecord
from django_sqltasks.testing import run_tasks
from tests import forkserver, tasks
from tests.conftest import ROOT, set_backend_options, worker_env
from tests.factories import superuser_client, task_row

# Levels of a nested errors value; MariaDB's JSON stops at 32, and refuses the row beyond.
DEEP = 28 if connection.vendor == "mysql" else 200


def nested(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


MISSHAPEN_ERRORS = [
    pytest.param({"exception_class_path": "x", "traceback": "y"}, id="a dict, not a list"),
    pytest.param("boom", id="a string"),
    pytest.param([1, None, ["x"]], id="items that are not dicts"),
    pytest.param([{"exception_class_path": 3, "traceback": ["a", "b"]}], id="values not text"),
    pytest.param([{"other": "keys"}], id="no keys"),
    pytest.param(
        [{"exception_class_path": "builtins.ValueError", "traceback": nested(DEEP)}],
        id="deep value",
    ),
    pytest.param(nested(DEEP), id="deep"),
]


@pytest.mark.django_db
@pytest.mark.parametrize("errors", MISSHAPEN_ERRORS)
def test_misshapen_errors_show_in_the_admin_and_read_back(errors: Any) -> None:
    row = task_row(TaskResultStatus.FAILED, errors=errors)
    client = superuser_client()
    listed = client.get(reverse("admin:django_sqltasks_taskrecord_changelist"))
    assert listed.status_code == 200
    page = client.get(reverse("admin:django_sqltasks_taskrecord_change", args=[row.pk]))
    assert page.status_code == 200
    result = task_backends["default"].get_result(str(row.pk))
    assert result.errors, "a FAILED row's errors, however stored, read back as at least one"
    for error in result.errors:
        assert isinstance(error.exception_class_path, str)
        assert isinstance(error.traceback, str)


def failed_chain() -> tuple[str, str]:
    """A chain whose first step failed: the ids of that step and of the one that never ran."""
    workflow = chain(tasks.fail.s("first"), tasks.add.s(1)).enqueue()
    first, second = workflow.task_ids
    run_tasks()
    assert TaskRecord.objects.get(pk=second).status == TaskResultStatus.FAILED
    return first, second


@pytest.mark.django_db
def test_a_workflow_step_that_never_ran_offers_no_retry_and_is_skipped_by_the_action() -> None:
    first, never_ran = failed_chain()
    client = superuser_client()
    page = client.get(reverse("admin:django_sqltasks_taskrecord_change", args=[never_ran]))
    assert b'id="sqltasks-retry"' not in page.content
    assert (
        b'id="sqltasks-retry"'
        in client.get(reverse("admin:django_sqltasks_taskrecord_change", args=[first])).content
    )
    response = client.post(
        reverse("admin:django_sqltasks_taskrecord_changelist"),
        {"action": "retry_tasks", "_selected_action": [never_ran]},
        follow=True,
    )
    text = response.content.decode()
    assert "0 task(s) retried" in text and "workflow steps that never ran" in text
    assert TaskRecord.objects.get(pk=never_ran).status == TaskResultStatus.FAILED


@pytest.mark.django_db
def test_a_workflow_step_page_shows_the_whole_error_and_no_far_future_time() -> None:
    _, never_ran = failed_chain()
    record = TaskRecord.objects.get(pk=never_ran)
    message = record.errors[-1]["traceback"]
    assert record.errors[-1]["exception_class_path"] == SKIPPED
    page = superuser_client().get(
        reverse("admin:django_sqltasks_taskrecord_change", args=[never_ran])
    )
    text = page.content.decode()
    assert message in text.replace("&#x27;", "'")
    assert "9999" not in text
    assert "white-space: pre-wrap" in text  # long lines wrap instead of running off


@pytest.mark.django_db
def test_times_show_their_seconds() -> None:
    enqueued = timezone.now().replace(microsecond=0) - timedelta(days=3)
    row = task_row(TaskResultStatus.SUCCESSFUL, enqueued_at=enqueued)
    client = superuser_client()
    page = client.get(reverse("admin:django_sqltasks_taskrecord_change", args=[row.pk]))
    shown = timezone.localtime(enqueued).strftime("%H:%M:%S")
    assert shown in page.content.decode()
    listed = client.get(reverse("admin:django_sqltasks_taskrecord_changelist")).content.decode()
    assert re.search(rf">[^<]*{shown}</time>", listed), "the list's time has its seconds"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("task_path", "said"),
    [
        ("tests.tasks.slow_sync", "1 running sync task(s) cannot be interrupted"),
        ("tests.tasks.slow_async", "1 running async task(s) will be cancelled at their worker"),
    ],
)
def test_cancelling_a_running_task_says_what_happens_to_it(task_path: str, said: str) -> None:
    row = task_row(TaskResultStatus.RUNNING, task_path=task_path, args=[1])
    response = superuser_client().post(
        reverse("admin:django_sqltasks_taskrecord_changelist"),
        {"action": "cancel_tasks", "_selected_action": [row.pk]},
        follow=True,
    )
    text = response.content.decode()
    assert "0 task(s) cancelled" not in text and "skipped" not in text
    assert said in text
    assert TaskRecord.objects.get(pk=row.pk).cancel_requested


def unreachable_env() -> dict[str, str]:
    """The test settings, pointed at a database of this run's kind that cannot be reached."""
    env = worker_env()
    env.pop("SQLTASKS_TEST_DB_NAME", None)
    if connection.vendor == "sqlite":
        env["SQLTASKS_SQLITE_PATH"] = "/nonexistent/folder/tasks.sqlite3"
        env.pop("DATABASE_URL", None)
    else:
        scheme = "postgres" if connection.vendor == "postgresql" else "mysql"
        user = connection.settings_dict["USER"]
        env["DATABASE_URL"] = f"{scheme}://{user}@127.0.0.1:1/sqltasks"
    return env


@pytest.mark.parametrize(
    "command",
    [
        ["tasks_status"],
        ["tasks_check"],
        ["tasks_prune", "--dry-run"],
        ["check", "--database", "default"],
    ],
)
def test_commands_say_in_one_line_that_the_database_is_down(command: list[str]) -> None:
    done = forkserver.run_django(command, unreachable_env(), worker_env(), str(ROOT), timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output
    assert "Cannot connect to database 'default'" in output


@pytest.mark.django_db
def test_commands_print_escape_sequences_of_stored_text_as_escapes() -> None:
    task_row(task_path="tests.tasks.gone\x1b[2J\x1b[31m", queue_name="default\x1b]0;owned\x07")
    checked, status = StringIO(), StringIO()
    with pytest.raises(CommandError):  # tasks_check fails when it finds a problem
        call_command("tasks_check", stdout=checked)
    call_command("tasks_status", stdout=status)
    for out in (checked.getvalue(), status.getvalue()):
        assert "\x1b" not in out and "\x07" not in out
    assert "gone\\x1b[2J\\x1b[31m" in checked.getvalue()
    assert "default\\x1b]0;owned\\x07" in status.getvalue()


@pytest.mark.django_db(transaction=True)
def test_worker_exclude_queues_runs_every_other_queue() -> None:
    ran = [tasks.noop.using(queue_name=queue).enqueue() for queue in ("default", "slow")]
    left = tasks.noop.using(queue_name="other").enqueue()
    call_command("tasks_worker", "-Q", "*", "-X", "other", "--burst", "-v", "0")
    for result in ran:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    left.refresh()
    assert left.status == TaskResultStatus.READY


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["-Q", "default", "-X", "other"], "with -Q '*' or without -Q"),
        (["-X", "nosuch"], "'nosuch' is not a queue"),
        (["-X", "default,other,slow"], "excludes every queue"),
        (["-p", "1", "--max-memory-per-child", "200000"], "write 200000KiB"),
        (["-p", "1", "--max-memory-per-child", "1.5G"], "such as 512 (MiB), 512MB"),
    ],
)
def test_worker_options_refused_with_a_hint(arguments: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("tasks_worker", *arguments)


def test_worker_help_examples_match_what_the_options_do(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        call_command("tasks_worker", "--help")
    text = capsys.readouterr().out
    assert "-l info " in text and "-l debug " not in text
    assert "--exclude-queues" in text and "200000KiB" in text


async def enqueue_view(request: HttpRequest) -> JsonResponse:
    result = await tasks.add.aenqueue(1, 2)
    fetched = await tasks.add.aget_result(result.id)
    return JsonResponse({"id": result.id, "status": fetched.status})


urlpatterns = [path("enqueue/", enqueue_view)]


@pytest.mark.django_db
def test_an_async_view_s_enqueue_is_rolled_back_with_the_test(settings: Any) -> None:
    settings.ROOT_URLCONF = __name__
    response = Client().get("/enqueue/")
    assert response.json()["status"] == "READY"  # read back inside the test's transaction
    task_id = response.json()["id"]
    assert TaskRecord.objects.filter(pk=task_id).exists()
    other = connections.create_connection("default")  # sees only what was committed
    try:
        with other.cursor() as cursor:
            cursor.execute(
                f"SELECT COUNT(*) FROM {TaskRecord._meta.db_table} WHERE id = %s",
                [TaskRecord._meta.pk.get_db_prep_value(uuid.UUID(task_id), other)],
            )
            assert cursor.fetchone()[0] == 0, "the row was committed beside the test"
    finally:
        other.close()


@pytest.mark.django_db
def test_a_task_outside_the_installed_apps_is_refused_at_enqueue_not_in_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """A new project's first task often lands in the project package (mysite/tasks.py), which
    is no installed app: a worker would not import it."""
    package = tmp_path / "mysite_h5"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(
        "from django_sqltasks.compat import task\n\n\n@task\ndef hello() -> str:\n    return 'hi'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mysite_h5.tasks", raising=False)
    hello = importlib.import_module("mysite_h5.tasks").hello
    with pytest.raises(InvalidTask, match="which a worker does not import") as info:
        hello.enqueue()
    assert "OPTIONS['TASK_MODULES']" in str(info.value)
    assert not TaskRecord.objects.exists()
    set_backend_options(settings, TASK_MODULES=["mysite_h5", "tests"])
    assert importlib.import_module("mysite_h5.tasks").hello.enqueue().status == "READY"


NUMBERS = {4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def test_the_docs_count_the_admin_pages_and_the_demo_s_tasks() -> None:
    pages = [m for m in admin.site._registry if m._meta.app_label == "django_sqltasks"]
    admin_doc = (ROOT / "docs" / "admin.md").read_text()
    assert f"adds {NUMBERS[len(pages)]} pages" in admin_doc
    for model in pages:
        assert f"**{model._meta.verbose_name_plural.title()}**" in admin_doc.title()
    # What the admin's Cancel does, as docs/admin.md's table of actions says it.
    assert "| `READY`, `RUNNING` |" in admin_doc
    demo = (ROOT / "example_project/shop/management/commands/demo.py").read_text()
    enqueued = demo.count("Enqueued(")
    quickstart = (ROOT / "docs" / "quickstart.md").read_text()
    assert f"enqueues {NUMBERS[enqueued]} things" in quickstart
    table = quickstart.split("TASK ", 1)[1].split("```", 1)[0].strip().splitlines()[1:]
    assert len(table) == enqueued, table
