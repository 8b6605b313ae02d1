"""A project that skipped a setup step: the app not installed, or the tables not migrated."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from django_sqltasks import SQLTaskBackend
from django_sqltasks.compat import InvalidTaskBackend
from tests import forkserver, tasks
from tests.conftest import ROOT, worker_env

MIGRATE = "run 'manage.py migrate'"


def test_enqueue_without_the_app_says_to_install_it() -> None:
    apps = [a for a in settings.INSTALLED_APPS if a != "django_sqltasks"]
    backend = SQLTaskBackend("default", {"BACKEND": "django_sqltasks.SQLTaskBackend"})
    with override_settings(INSTALLED_APPS=apps):
        with pytest.raises(InvalidTaskBackend) as caught:
            backend.enqueue(tasks.add, [1, 2], {})
        assert "add 'django_sqltasks' to INSTALLED_APPS" in str(caught.value)
        # The check says the same, under its id.
        errors = [m for m in backend.check() if m.id == "django_sqltasks.E001"]
        assert len(errors) == 1


# Django Tasks' own module: the test project's tasks import it, as a new project's do.
TASKS_API = "django.tasks" if find_spec("django.tasks") is not None else "django_tasks"


def check_a_project_without_the_app(tmp_path: Path, *, tasks_at_start_up: bool) -> str:
    """Run ``manage.py check`` in a new project whose TASKS names this backend but whose
    INSTALLED_APPS lacks the app; its tasks module is imported by its models (at start-up, as
    ``check`` begins) or, as most are, only by its views. Return what ``check`` printed."""
    app = tmp_path / "shop"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "tasks.py").write_text(f"from {TASKS_API} import task\n\n\n@task\ndef hello(): ...\n")
    (app / "models.py").write_text("from . import tasks  # noqa\n" if tasks_at_start_up else "")
    (app / "views.py").write_text("from . import tasks  # noqa\n")
    (app / "urls.py").write_text("from . import views  # noqa\n\nurlpatterns = []\n")
    # On Django 5.2 the backport's app registers its check in ready(): it loads at start-up.
    backport = ["django_tasks"] if tasks_at_start_up and TASKS_API == "django_tasks" else []
    apps = ["django.contrib.contenttypes", "django.contrib.auth", "shop", *backport]
    (tmp_path / "newsite_settings.py").write_text(
        'SECRET_KEY = "a new project"\n'
        f"INSTALLED_APPS = {apps!r}\n"
        "DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3', 'NAME': ':memory:'}}\n"
        "ROOT_URLCONF = 'shop.urls'\n"
        "TASKS = {'default': {'BACKEND': 'django_sqltasks.backend.SQLTaskBackend'}}\n"
    )
    env = {
        **worker_env(),
        "PYTHONPATH": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "newsite_settings",
    }
    done = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout + done.stderr


def test_check_reports_the_missing_app_when_django_tasks_is_loaded_at_start_up(
    tmp_path: Path,
) -> None:
    output = check_a_project_without_the_app(tmp_path, tasks_at_start_up=True)
    assert "django_sqltasks.E001" in output
    assert "Add 'django_sqltasks' to INSTALLED_APPS, then run migrate." in output


def test_check_cannot_report_the_missing_app_when_only_views_import_the_tasks(
    tmp_path: Path,
) -> None:
    """Django registers its tasks check when Django Tasks is first imported, and ``check`` runs
    the checks registered when it starts: tasks imported by views (the URL check imports them
    while the checks run) come too late, and this package is never loaded. docs/operations.md
    (E001) and docs/quickstart.md say so; enqueueing raises with the same advice. A Django that
    registers its tasks check up front would fail this test: then say so in those pages."""
    output = check_a_project_without_the_app(tmp_path, tasks_at_start_up=False)
    assert "System check identified no issues" in output


@contextlib.contextmanager
def empty_database() -> Iterator[dict[str, str]]:
    """A database of the same server with no tables: the env that points a subprocess at it."""
    if connection.vendor == "sqlite":
        path = Path(str(connection.settings_dict["NAME"])).with_name("never_migrated.sqlite3")
        path.unlink(missing_ok=True)
        yield {"SQLTASKS_TEST_DB_NAME": str(path)}
        path.unlink(missing_ok=True)
        return
    name = f"{connection.settings_dict['NAME']}_never_migrated"
    quoted = connection.ops.quote_name(name)
    with connection._nodb_cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {quoted}")
        cursor.execute(f"CREATE DATABASE {quoted}")
    try:
        yield {"SQLTASKS_TEST_DB_NAME": name}
    finally:
        with connection._nodb_cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {quoted}")


def run_python(env: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` on ``env``'s database (forked from the fork server, as workers are)."""
    return forkserver.run_python(code, worker_env(**env), worker_env(), str(ROOT), timeout=60)


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m django *args`` on ``env``'s database, the same way."""
    return forkserver.run_django(list(args), worker_env(**env), worker_env(), str(ROOT), timeout=60)


ENQUEUE = (
    "import django; django.setup()\n"
    "from tests import tasks\n"
    "try:\n"
    "    tasks.add.enqueue(1, 2)\n"
    "except Exception as e:\n"
    "    print(type(e).__name__, e)\n"
)
AENQUEUE = (
    "import asyncio, django; django.setup()\n"
    "from tests import tasks\n"
    "try:\n"
    "    asyncio.run(tasks.add.aenqueue(1, 2))\n"
    "except Exception as e:\n"
    "    print(type(e).__name__, e)\n"
)


@pytest.mark.django_db(transaction=True)
def test_forgotten_migrate_is_reported_the_same_way_everywhere() -> None:
    with empty_database() as env:
        for code in (ENQUEUE, AENQUEUE):
            enqueued = run_python(env, code)
            assert MIGRATE in enqueued.stdout, enqueued.stdout + enqueued.stderr
            assert enqueued.stdout.split()[0] in {"ProgrammingError", "OperationalError"}

        status = manage(env, "tasks_status")
        assert status.returncode == 1
        assert status.stderr.startswith("CommandError: The django_sqltasks tables in database")
        assert MIGRATE in status.stderr and "Traceback" not in status.stderr

        check = manage(env, "check", "--database", "default")
        assert "django_sqltasks.W002" in check.stderr, check.stderr
        assert "0001_initial" in check.stderr and MIGRATE in check.stderr

        worker = manage(env, "tasks_worker", "--burst")
        assert worker.returncode == 1
        assert "migrate" in worker.stderr and "Traceback" not in worker.stderr
