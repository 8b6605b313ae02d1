"""Run Django's own tests of Django Tasks (its ``tests/tasks`` folder) against django-sqltasks.

Django's tests are written for its two built-in backends. This script runs them unchanged, from
a copy of Django's source you point it at, with those backends swapped for ours:

* ``DummyBackend`` (stores tasks, runs none) becomes ``SQLTaskBackend``, with the two
  test-only members Django's tests call on it: ``results`` (the stored tasks, oldest first)
  and ``clear()`` (delete them).
* ``ImmediateBackend`` (runs each task as it is enqueued) becomes
  ``django_sqltasks.testing.ImmediateSQLTaskBackend``.

Every test may use the database (Django's are ``SimpleTestCase``s, which refuse it), and the
task table is emptied before each one. Nothing from Django is copied into this repository::

    pip download django==6.1.3 --no-binary :all: --no-deps -d /tmp/django-src
    tar xzf /tmp/django-src/django-6.1.3.tar.gz -C /tmp/django-src
    python scripts/django_contract.py /tmp/django-src/django-6.1.3/tests/tasks

``DATABASE_URL`` picks the database (SQLite in a temporary folder by default). The report lists
each test that does not pass, marked "documented" when docs/guarantees.md states the difference
as a design choice of this backend (``DOCUMENTED`` below). The exit status is 1 if any other
test fails.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import unittest
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# Tests that fail by design, each with the reason docs/guarantees.md ("Django's own tests") gives.
STORED = "tasks are rows read back from the database, not the objects the test holds"
GET_RESULT = "results can be read back (supports_get_result is True)"
DOCUMENTED: dict[str, str] = {
    "test_dummy_backend.DummyBackendTestCase.test_refresh_result": STORED,
    "test_dummy_backend.DummyBackendTestCase.test_refresh_result_async": STORED,
    "test_tasks.TaskTestCase.test_refresh_result": (
        "refresh() reads the database, which Django refuses on an event loop: use arefresh()"
    ),
    "test_immediate_backend.ImmediateBackendTestCase.test_cannot_get_result": GET_RESULT,
    "test_immediate_backend.ImmediateBackendTestCase.test_cannot_refresh_result": GET_RESULT,
    "test_immediate_backend.ImmediateBackendTestCase.test_cannot_pass_run_after": (
        "run_after is supported: the task waits in the table until it is due"
    ),
    "test_immediate_backend.ImmediateBackendTestCase.test_complex_return_value": (
        "a return value that is not JSON fails with InvalidReturnValue, a TypeError that names it"
    ),
}


def configure(database_url: str | None) -> None:
    """Settings for the run: our app and its tables, Django's task tests' package on the path."""
    import dj_database_url
    from django.conf import settings

    url = database_url or f"sqlite:///{tempfile.mkdtemp(prefix='contract-')}/contract.sqlite3"
    database = dj_database_url.parse(url, conn_max_age=0)
    if database["ENGINE"].endswith("sqlite3"):
        database["TEST"] = {"NAME": database["NAME"] + ".test"}
    settings.configure(
        DEBUG=False,
        USE_TZ=True,
        SECRET_KEY="django-contract-run",
        INSTALLED_APPS=[
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django_sqltasks",
            "tasks",  # Django's tests/tasks: workers import tasks of installed apps only
        ],
        DATABASES={"default": database},
        TASKS={"default": {"BACKEND": "django_sqltasks.backend.SQLTaskBackend"}},
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
    )


def swap_backends() -> None:
    """Make Django's two built-in backend paths name ours (before the tests import them)."""
    import django.tasks.backends.dummy as dummy
    import django.tasks.backends.immediate as immediate
    from django.db import connections

    from django_sqltasks import SQLTaskBackend
    from django_sqltasks.compat import TaskResult
    from django_sqltasks.models import TaskRecord
    from django_sqltasks.testing import ImmediateSQLTaskBackend

    class StoredResults:
        """DummyBackend's test-only members, on this backend's table."""

        alias: str
        database: str

        @property
        def results(self) -> list[TaskResult]:
            # Django's async tests read this on their event loop, where queries are refused.
            if in_event_loop():
                with ThreadPoolExecutor(1) as pool:
                    return pool.submit(self._read_results, True).result()
            return self._read_results()

        def _read_results(self, in_pool: bool = False) -> list[TaskResult]:
            rows = TaskRecord.objects.using(self.database).for_backend(self.alias)
            ids = rows.order_by("enqueued_at", "id").values_list("id", flat=True)
            try:
                return [self.get_result(str(i)) for i in ids]  # type: ignore[attr-defined]
            finally:
                if in_pool:
                    connections.close_all()  # the pool thread's own connections

        def clear(self) -> None:
            TaskRecord.objects.using(self.database).for_backend(self.alias).delete()

    class DummyBackend(StoredResults, SQLTaskBackend):
        """SQLTaskBackend under the name Django's tests give the backend that stores tasks."""

    class ImmediateBackend(StoredResults, ImmediateSQLTaskBackend):
        """ImmediateSQLTaskBackend under the name Django's tests give the one that runs them."""

    dummy.DummyBackend = DummyBackend  # type: ignore[misc,assignment]
    immediate.ImmediateBackend = ImmediateBackend  # type: ignore[misc,assignment]


def in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def tests_of(suite: unittest.TestSuite) -> Iterator[unittest.TestCase]:
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from tests_of(item)
        else:
            yield item


def open_to_the_database(suite: unittest.TestSuite) -> None:
    """Let every test use the database, and start each with an empty task table."""
    from django_sqltasks.models import TaskRecord

    for cls in {type(test) for test in tests_of(suite)}:
        if getattr(cls, "_contract_ready", False):
            continue
        cls.databases = {"default"}  # type: ignore[attr-defined]
        cls.available_apps = None  # type: ignore[attr-defined]  # [] would hide our tables
        set_up = cls.setUp

        def empty_then_set_up(self: Any, _set_up: Any = set_up) -> None:
            TaskRecord.objects.all().delete()
            _set_up(self)

        cls.setUp = empty_then_set_up  # type: ignore[method-assign]
        cls._contract_ready = True  # type: ignore[attr-defined]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tests", type=Path, help="Django's tests/tasks folder")
    parser.add_argument("-k", dest="pattern", help="only tests whose name holds this")
    args = parser.parse_args()
    folder: Path = args.tests.resolve()
    if not (folder / "test_tasks.py").exists():
        parser.error(f"{folder} is not Django's tests/tasks folder (it has no test_tasks.py)")
    sys.path[:0] = [str(REPO), str(folder.parent)]  # Django's tests import 'tasks.tasks'
    configure(os.environ.get("DATABASE_URL"))
    import django

    django.setup()
    swap_backends()

    from django.test.runner import DiscoverRunner

    runner = DiscoverRunner(verbosity=0, interactive=False)
    suite = unittest.defaultTestLoader.discover(str(folder), top_level_dir=str(folder.parent))
    if args.pattern:
        suite = unittest.TestSuite(t for t in tests_of(suite) if args.pattern in t.id())
    open_to_the_database(suite)
    runner.setup_test_environment()
    old_config = runner.setup_databases()
    try:
        with open(os.devnull, "w") as quiet:
            result = unittest.TextTestRunner(verbosity=0, stream=quiet).run(suite)
    finally:
        runner.teardown_databases(old_config)
        runner.teardown_test_environment()
    return report(result)


def report(result: unittest.TestResult) -> int:
    failed: dict[str, str] = {}
    for test, trace in [*result.failures, *result.errors]:
        name = test.id().removeprefix("tasks.").split(" ")[0]
        failed.setdefault(name, trace.strip().splitlines()[-1])
    documented = [name for name in failed if name in DOCUMENTED]
    unexpected = {name: line for name, line in failed.items() if name not in DOCUMENTED}
    for name in sorted(documented):
        print(f"documented  {name}: {DOCUMENTED[name]}")
    for name, line in sorted(unexpected.items()):
        print(f"FAILED      {name}: {line[:200]}")
    run = result.testsRun
    skipped = len(result.skipped)
    passed = run - skipped - len(failed)
    print(
        f"{run} tests: {passed} passed, {len(documented)} differ as documented, "
        f"{len(unexpected)} failed, {skipped} skipped"
    )
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
