"""What every command does alike when the database cannot be reached: one line naming it,
no traceback."""

from __future__ import annotations

import pytest
from django.db import connection

from tests import forkserver
from tests.conftest import ROOT, worker_env


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


def test_a_queue_named_twice_is_one_queue() -> None:
    """``-Q default,default`` (the commands' queue lists): each queue once, in order."""
    from django_sqltasks.management.arguments import queue_names

    assert queue_names("default, emails,default") == ["default", "emails"]


def test_a_nul_in_a_stored_text_is_refused_on_every_database_alike() -> None:
    """The message says why on any database: it named PostgreSQL on MariaDB and SQLite too."""
    from django_sqltasks.core.serialization import text_problem

    problem = text_problem("a\x00b")
    assert problem is not None and "not every supported database" in problem
