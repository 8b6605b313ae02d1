"""Fixtures shared by every test module: real databases, real workers."""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management.commands import flush
from django.db import connection
from django.utils import timezone

from django_sqltasks.management import logs
from django_sqltasks.models import TaskRecord, WorkerRecord
from django_sqltasks.worker import Worker
from tests import forkserver
from tests.events import ENV as EVENTS_ENV
from tests.events import EventLog, Gate, listening

ROOT = Path(__file__).resolve().parent.parent


# The modules of the Django 5.2 leg (marker django_api): what changes when Django Tasks comes from
# the django-tasks backport and Django is 5.2. The rest of the package runs the same code there.
DJANGO_API_MODULES = {
    "tests.test_contract": "Django's Tasks API as Django's own tests use it",
    "tests.test_conformance": "the backend contract, point by point",
    "tests.test_backend": "enqueue, results, validation: the backend interface",
    "tests.enqueue.test_writes": "aenqueue and enqueue_many, Django Tasks' signals",
    "tests.enqueue.test_rows": "the exceptions Django Tasks defines, raised at each entry",
    "tests.worker.test_retries": "the task decorator's options on the Task class of either source",
    "tests.worker.test_runner": "TaskContext, TaskResult, the started/finished signals, as built",
    "tests.store.test_results": "results read back for tasks that are gone: the stand-in Task",
    "tests.testing.test_capture": "the testing helpers over Django Tasks' results",
    "tests.testing.test_immediate": "ImmediateSQLTaskBackend on the source's ImmediateBackend",
    "tests.testing.test_runner": "run_tasks() builds contexts and results as a worker does",
    "tests.testing.test_progress": "run_tasks() with snoozes and progress reports",
    "tests.management.test_tasks_check": "tasks_check resolves task paths to Task objects",
    "tests.ops.test_checks": "system checks and the migrations on that Django version",
    "tests.ops.test_installation": "a project without the app or its tables, on that version",
    "tests.admin.test_tasks": "the admin's templates, which extend that Django version's",
}


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Any:
    """Markers by what a test needs (the list: pyproject.toml), before ``-m`` selects by
    them: every test that starts worker processes through the fixture is a ``worker_process``
    test; the modules above are ``django_api``. Then, once the selection is made, the order
    in which pytest-xdist hands the tests out (``balanced``)."""
    for item in items:
        if "worker_process" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.worker_process)
        module = getattr(item, "module", None)
        if module is not None and module.__name__ in DJANGO_API_MODULES:
            item.add_marker(pytest.mark.django_api)
    result = yield
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        items[:] = balanced(items, int(workerinput["workercount"]))
    return result


def starts_processes(item: pytest.Item) -> bool:
    """Whether ``item`` may start processes: a worker through the fixture, or a command or
    an interpreter from a module that imports the means (most of these take seconds)."""
    module = getattr(item, "module", None)
    return "worker_process" in getattr(item, "fixturenames", ()) or any(
        hasattr(module, name) for name in ("forkserver", "subprocess", "run_python")
    )


def balanced(items: list[pytest.Item], processes: int) -> list[pytest.Item]:
    """Order ``items`` so that each pytest-xdist process starts its share with the tests
    that start processes, the worker-process ones first; the others follow, as they were.

    pytest-xdist's worksteal scheduler gives each of the ``processes`` a run of consecutive
    tests, the same number each, which it runs from the front while an idle one takes from
    the back of another's. In the order collected (pytest-django's: tests in transactions
    first), the tests that start processes, which take seconds where the others take
    hundredths, went mostly to one process, whose last ones were still running seconds after
    the others had finished. Every xdist process sorts the same collection the same way, as
    pytest-xdist requires. The sizes of the runs are the scheduler's
    (``WorkStealingScheduling.check_schedule``).
    """
    slow = sorted(
        (item for item in items if starts_processes(item)),
        key=lambda item: "worker_process" not in getattr(item, "fixturenames", ()),
    )
    quick = iter([item for item in items if not starts_processes(item)])
    order: list[pytest.Item] = []
    left = len(items)
    for share in range(processes):
        size = left // (processes - share)
        left -= size
        first = slow[share::processes]
        order += first + list(itertools.islice(quick, max(size - len(first), 0)))
    return order + list(quick)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what collection built (the modules, the test items, Django's apps) out of the
    garbage collector's reach: it would walk them all again at each full collection, a few
    percent of the suite's CPU."""
    gc.freeze()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Escape lone surrogates in a report's captured output. The hostile-input tests log
    them; pytest-xdist sends each report to the controller as UTF-8, and one such character
    ended the xdist process with every test it had left."""
    report = yield
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        for title, text in report.sections
    ]
    return report


@pytest.fixture(autouse=True)
def _worker_loggers_restored() -> Iterator[None]:
    """Give the loggers ``tasks_worker`` configures back as the test found them.

    The command run in this process (``call_command``) sets their levels for the whole process:
    after ``-v 0``, ``django_sqltasks`` drops INFO for every later test, and a test that acts on
    INFO records (a handler that sets an event) waits out its timeout. Restored after every
    test, not only the command's, so that no test's outcome depends on which ran before it.
    """
    saved = [
        (logger, logger.level, list(logger.handlers), logger.propagate)
        for logger in map(logging.getLogger, logs.LOGGERS)
    ]
    yield
    for logger, level, handlers, propagate in saved:
        logger.setLevel(level)
        for handler in [h for h in logger.handlers if h not in handlers]:
            logger.removeHandler(handler)
        logger.propagate = propagate


@pytest.fixture
def run_worker() -> Callable[..., Worker]:
    """Run an in-process worker in burst mode until no runnable task is left."""

    def run(*, timeout: float = 60, **kwargs: Any) -> Worker:
        kwargs.setdefault("burst", True)
        kwargs.setdefault("queue_names", ["*"])
        kwargs.setdefault("concurrency", 4)
        worker = Worker(**kwargs)
        # A safety net: a worker that never reaches its exit condition fails the test.
        fired: list[bool] = []

        def stop() -> None:
            fired.append(True)
            worker.stop()

        watchdog = threading.Timer(timeout, stop)
        watchdog.start()
        try:
            worker.run()
        finally:
            watchdog.cancel()
        if fired:
            pytest.fail(f"the worker did not stop by itself within {timeout}s")
        return worker

    return run


WORKER_APPLICATION_NAME = "sqltasks-test-worker"


def worker_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["SQLTASKS_TEST_DB_NAME"] = str(connection.settings_dict["NAME"])
    # libpq names the worker's PostgreSQL sessions, so a test can end just those.
    env["PGAPPNAME"] = WORKER_APPLICATION_NAME
    env.update(extra)
    return env


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code`` with Django set up on ``env``'s database (forked from the fork
    server, as workers are)."""
    return forkserver.run_python(
        f"import django; django.setup()\n{code}",
        worker_env(**env),
        worker_env(),
        str(ROOT),
        timeout=120,
    )


@pytest.fixture(scope="session", autouse=True)
def _flush_restores_the_migrated_rows(
    django_db_setup: Any, django_db_blocker: Any
) -> Iterator[None]:
    """Make the flush after each ``transaction=True`` test put back the content types and
    permissions from a copy taken once, instead of sending ``post_migrate`` again.

    Django's flush empties every table, then sends ``post_migrate`` so that the contenttypes
    and auth apps write their rows again: about a hundred queries, 30 ms of CPU after each of
    the suite's 500 transactional tests. Those apps are the only receivers here, and what
    they write depends on the installed models alone, which no test changes: the rows read
    after migrate are the rows they would write (with the same ids, where theirs would be new).
    """
    with django_db_blocker.unblock():
        if ContentType._meta.db_table not in connection.introspection.table_names():
            # No test of the session needs a database, so pytest-django made none.
            yield
            return
        content_types = list(ContentType.objects.order_by("pk"))
        permissions = list(Permission.objects.order_by("pk"))
    send_post_migrate = flush.emit_post_migrate_signal

    def restore(verbosity: int, interactive: bool, db: str) -> None:
        if db != "default":
            send_post_migrate(verbosity, interactive, db)
            return
        ContentType.objects.clear_cache()  # as create_contenttypes does
        ContentType.objects.using(db).bulk_create(content_types)
        Permission.objects.using(db).bulk_create(permissions)

    flush.emit_post_migrate_signal = restore
    yield
    flush.emit_post_migrate_signal = send_post_migrate


@pytest.fixture(scope="session", autouse=True)
def _fork_server() -> Iterator[None]:
    """End the fork server that started the session's workers (see ``tests.forkserver``)."""
    yield
    forkserver.stop_server()


@pytest.fixture
def events() -> Iterator[EventLog]:
    """The events of the test's workers (in its process and in the worker processes it
    starts) and of their tasks, to wait on."""
    log = EventLog()
    try:
        with listening(log):
            yield log
    finally:
        log.close()


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Gate]:
    """A gate the test's tasks wait at (``tests.events.wait_at(gate.path)``) until it opens."""
    fifo = Gate(str(tmp_path / "gate"))
    yield fifo
    fifo.close()


class WorkerProcess:
    """A ``manage.py tasks_worker`` subprocess on the test database; output goes to a file,
    events to ``events`` (see ``tests.events``)."""

    def __init__(
        self, *args: str, env: dict[str, str] | None = None, events: EventLog | None = None
    ) -> None:
        self.args = args
        if events is not None:
            env = {EVENTS_ENV: events.path, **(env or {})}
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            prefix="worker-", suffix=".log", delete=False
        )
        self.proc = forkserver.start_worker(
            list(args), worker_env(**(env or {})), worker_env(), str(ROOT), self.log
        )

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def kill(self) -> None:
        self.proc.kill()

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"worker did not exit in {timeout}s:\n{self.output}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    @property
    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")


@pytest.fixture
def worker_process(events: EventLog) -> Iterator[Callable[..., WorkerProcess]]:
    """Start real worker processes, which send their events to ``events``; any still running
    at the end are killed."""
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        process = WorkerProcess(*args, env=env, events=events)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
        Path(process.log.name).unlink(missing_ok=True)


def set_backend_options(settings: Any, **options: Any) -> None:
    """Override OPTIONS of the default task backend for one test (through pytest-django's
    ``settings``, so the backend is rebuilt and the change undone after the test)."""
    default = settings.TASKS["default"]
    settings.TASKS = {
        **settings.TASKS,
        "default": {**default, "OPTIONS": {**default["OPTIONS"], **options}},
    }


@contextlib.contextmanager
def worker_thread(worker: Worker, stop_timeout: float = 15) -> Iterator[threading.Thread]:
    """Run ``worker`` on a thread for the ``with`` block; then stop it and fail if it hangs."""
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        yield runner
    except BaseException:
        # The test failed inside the block: let its tasks through their gates, or the worker
        # would wait for them and outlive the test, running into the next ones.
        Gate.open_all()
        raise
    finally:
        worker.stop()
        runner.join(stop_timeout)
    assert not runner.is_alive(), f"the worker did not stop within {stop_timeout}s"


def run_burst_or_fail(timeout: float, failure: str, **kwargs: Any) -> Worker:
    """Run a burst worker on a thread; stop it and fail with ``failure`` if it has not finished
    within ``timeout`` seconds (a worker stuck on a bad task would otherwise run forever)."""
    kwargs.setdefault("queue_names", ["*"])
    kwargs.setdefault("concurrency", 4)
    worker = Worker(burst=True, **kwargs)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    runner.join(timeout=timeout)
    if runner.is_alive():
        worker.stop()
        runner.join(timeout=10)
        pytest.fail(failure)
    return worker


def expire_lease(worker_id: str) -> None:
    """Date the last heartbeat of ``worker_id`` an hour back: its lease has run out, by the
    database's clock too, with no wait (the rescue compares the column with that clock)."""
    stale = timezone.now() - timedelta(hours=1)
    if WorkerRecord.objects.filter(id=worker_id).update(heartbeat_at=stale) == 0:
        # Its row is gone already: a live worker deleted it once its lease (a few seconds in
        # these tests) had run out, which on a loaded machine can happen before this line.
        # The rescue that deleted it requeued its tasks first (worker/lease.py: rescue).
        assert not TaskRecord.objects.filter(owner=worker_id, status="RUNNING").exists()


class Clock:
    """A stand-in for a module's ``time`` (``monkeypatch.setattr(module, "time", clock)``) whose
    monotonic clock is ``ahead`` seconds off the real one: a test moves time as data."""

    def __init__(self, ahead: float = 0.0) -> None:
        self.ahead = ahead

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead


def wait_for(predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


@pytest.fixture(autouse=True, scope="session")
def _report_leaked_connections(django_db_setup: Any, django_db_blocker: Any) -> Iterator[None]:
    """Before the test database is dropped, wait for background connections to close.

    Worker threads (the LISTEN thread, say) close their connections shortly after a worker
    stops; on a loaded machine that can lag behind the last test. Any still open after a few
    seconds are named, then ended, so that dropping the database does not fail.
    """
    yield
    if connection.vendor != "postgresql":
        return
    query = (
        "SELECT pid, state, left(query, 200) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        deadline = time.monotonic() + 10
        while True:
            cursor.execute(query)
            leaked = cursor.fetchall()
            if not leaked or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if leaked:
            print(f"\nConnections still open after the tests, now ended: {leaked}")
            for pid, _, _ in leaked:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
