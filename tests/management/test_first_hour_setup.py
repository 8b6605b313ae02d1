"""A new project's first mistakes, each met with a short message that says what to fix: a
wrong BACKEND path, an unknown alias or queue, a command piped into ``head``, a table not
migrated yet."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.core import checks
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

from django_sqltasks.compat import task_backends
from django_sqltasks.core import tasks_check
from tests.conftest import ROOT, worker_env

WRONG_PATH = {
    "default": {"BACKEND": "django_sqltasks.SQLTasksBackend"},  # "Tasks": a typo
    "other": {"BACKEND": "django_sqltasks.backend.SQLTaskBackend", "QUEUES": ["x" * 300]},
}


@pytest.mark.django_db
def test_a_wrong_backend_path_is_one_check_error_and_the_others_are_still_checked() -> None:
    with override_settings(TASKS=WRONG_PATH):
        # The database checks too (check --database), which look up this app's backends.
        found = checks.run_checks(databases=["default"])
    ids = [message.id for message in found]
    assert ids.count("django_sqltasks.E020") == 1
    assert "django_sqltasks.E004" in ids  # the other backend's queue name, still checked
    [error] = [message for message in found if message.id == "django_sqltasks.E020"]
    assert error.msg == (
        "TASKS['default']['BACKEND'] is 'django_sqltasks.SQLTasksBackend', which cannot be "
        'loaded: Module "django_sqltasks" does not define a "SQLTasksBackend" attribute/class'
    )
    assert "'django_sqltasks.backend.SQLTaskBackend'" in str(error.hint)


def test_djangos_own_tasks_check_is_replaced() -> None:
    """Django's check raises at the first backend it cannot load (a 70-line traceback from
    ``manage.py check``); only this app's runs."""
    registered = checks.registry.registry.registered_checks
    names = {f"{check.__module__}.{check.__name__}" for check in registered}
    assert f"{tasks_check.__name__}.check_tasks" in names
    module = type(task_backends).__module__
    assert f"{module}.checks.check_tasks" not in names


def test_the_worker_blames_the_tasks_entry_not_a_flag_nobody_passed() -> None:
    with override_settings(TASKS=WRONG_PATH), pytest.raises(CommandError) as caught:
        call_command("tasks_worker", "--burst")
    assert str(caught.value).startswith("TASKS['default']: Could not find backend ")


def test_an_unknown_alias_blames_the_flag_and_lists_the_aliases() -> None:
    with pytest.raises(CommandError) as caught:
        call_command("tasks_worker", "--burst", "--backend", "nope")
    assert str(caught.value).startswith("--backend: 'nope' is not in TASKS (its aliases: ")
    assert "'default'" in str(caught.value)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "command",
    [
        ["tasks_status"],
        ["tasks_queue", "limits"],
        ["tasks_check"],
        ["tasks_prune", "--dry-run"],
        ["check"],
        ["tasks_worker", "--help"],
    ],
)
def test_a_command_piped_into_head_stops_without_a_traceback(command: list[str]) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "django", *command],
        cwd=ROOT,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # head has read its lines: the command's next write fails
    errors = process.stderr.read()
    process.stderr.close()
    status = process.wait(timeout=60)
    assert "Traceback" not in errors and "BrokenPipeError" not in errors, errors
    assert status in (0, 1), errors


@pytest.mark.skipif(connection.vendor != "postgresql", reason="autovacuum is PostgreSQL's")
@pytest.mark.django_db
def test_autovacuum_is_not_judged_for_a_table_that_does_not_exist_yet() -> None:
    """Before ``migrate`` there is no task table to clean: W003 says nothing of it (W002 says
    to migrate)."""
    from django_sqltasks.sql.health import read_postgresql  # PostgreSQL's reader only

    with connection.cursor() as cursor:
        health = read_postgresql(cursor, connection.ops.quote_name("never_migrated_tasks"))
    assert health.autovacuum is None and health.autovacuum_off_by == ()
    assert health.live_rows is None and health.dead_rows is None
