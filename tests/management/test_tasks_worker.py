"""``manage.py tasks_worker``'s options: queues, limits, logging, help, version, start-up."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord
from tests import forkserver, tasks
from tests.conftest import ROOT, WorkerProcess, wait_for, worker_env

StartWorker = Callable[..., WorkerProcess]


def manage(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m django <args>`` on the test database and return what it printed."""
    return forkserver.run_django(
        list(args), worker_env(**(env or {})), worker_env(), str(ROOT), timeout=60
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-Q", "defualt"], "'defualt' is not a queue of backend 'default', whose QUEUES are: "),
        (["-Q", "default,emails"], "'emails' is not a queue"),
        (["-Q", "a", "-Q", "b"], "'a', 'b' are not queues"),
        (["-Q", "default,,other"], "has an empty queue name"),
        (["-Q", "q" * 65], "a queue name must be 1 to 64 characters long, not 65"),
        (["-Q", "q\x00"], "a queue name must not contain control characters (such as NUL)"),
        (["-Q", "q\udcff"], "a queue name must be valid UTF-8 text"),
        (["--worker-id", "w\udcff"], "--worker-id: a worker id must be valid UTF-8 text"),
        (["--worker-id", "w\x00"], "--worker-id: a worker id must not contain control"),
        (["-c", "1001"], "--concurrency: must be at most 1000, not 1001"),
        (["--concurrency", "100000"], "--concurrency: must be at most 1000"),
        (["--prefetch", "100000000"], "--prefetch: must be at most 10000"),
        (["--prefetch", "-1"], "--prefetch: must be at least 0"),
        (["--poll-interval", "1e-9"], "--poll-interval: must be at least 0.01 seconds"),
        (["--poll-interval", "inf"], "--poll-interval: must be a positive, finite number"),
        (["--wait-for-database", "-1"], "--wait-for-database: must be zero or more seconds"),
        (["-l", "chatty"], "--loglevel: must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        (["--metrics-host", ""], "--metrics-host: must be 1 to 255"),
        (["--metrics-port", "70000"], "--metrics-port: must be a TCP port, 1 to 65535"),
    ],
)
def test_bad_options_are_refused_naming_the_option_and_the_rule(
    args: list[str], message: str
) -> None:
    with pytest.raises(CommandError) as caught:
        call_command("tasks_worker", *args)
    assert message in str(caught.value)


def test_a_non_utf8_queue_argument_is_refused_before_the_worker_starts() -> None:
    # A byte that is not UTF-8 reaches Python as a lone surrogate (PEP 383).
    done = manage("tasks_worker", "-Q", "q\udcff", "--burst")
    assert done.returncode == 2, done.stderr
    assert "-Q/--queue/--queues: a queue name must be valid UTF-8 text" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.worker_process
@pytest.mark.django_db(transaction=True)
def test_queues_given_comma_separated_and_repeated_are_all_run(
    worker_process: StartWorker,
) -> None:
    on = {q: tasks.noop.using(queue_name=q).enqueue() for q in ("default", "other", "slow")}
    worker = worker_process("--burst", "-Q", "default, other", "--queue", "default", "-c", "2")
    assert worker.wait() == 0, worker.output
    status = {q: TaskRecord.objects.get(pk=r.id).status for q, r in on.items()}
    assert status == {
        "default": TaskResultStatus.SUCCESSFUL,
        "other": TaskResultStatus.SUCCESSFUL,
        "slow": TaskResultStatus.READY,
    }, worker.output


@pytest.mark.worker_process
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "django_lines", "debug_lines"),
    [
        ([], True, False),  # -v 1: INFO from both loggers
        (["-v", "0"], False, False),
        (["-l", "warning"], False, False),
        (["-v", "0", "--loglevel", "DEBUG"], True, True),  # --loglevel wins over -v
        (["-v", "2"], True, True),
    ],
)
def test_verbosity_and_loglevel_govern_the_worker_and_django_task_loggers(
    args: list[str], django_lines: bool, debug_lines: bool
) -> None:
    result = tasks.add.enqueue(2, 3)
    # A new project's logging: DEBUG on, nothing configured for either logger.
    done = manage(
        "tasks_worker",
        "--burst",
        "-Q",
        "default",
        *args,
        env={"DJANGO_SETTINGS_MODULE": "tests.settings_debug"},
    )
    assert done.returncode == 0, done.stderr
    # Django's django.tasks logger writes "Task id=… path=… state=SUCCESSFUL" at INFO.
    django_line = f"Task id={result.id} path=tests.tasks.add state=SUCCESSFUL"
    # Printed once (never also by DEBUG's console handler), or not at all.
    printed = [line for line in done.stderr.splitlines() if line.endswith(django_line)]
    assert len(printed) == django_lines, done.stderr
    assert (" DEBUG django_sqltasks: " in done.stderr) is debug_lines, done.stderr


@pytest.mark.worker_process
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("args", "django_lines"), [([], False), (["-l", "info"], True)])
def test_without_debug_djangos_line_per_task_shows_only_when_asked(
    args: list[str], django_lines: bool
) -> None:
    """DEBUG off (production): Django's default logging would not show its line per task, and
    the worker does not build it either, unless asked; a failure still shows."""
    ok = tasks.add.enqueue(2, 3)
    bad = tasks.fail.enqueue("shown")
    done = manage("tasks_worker", "--burst", "-Q", "default", *args)
    assert done.returncode == 0, done.stderr
    assert (f"Task id={ok.id} path=tests.tasks.add state=SUCCESSFUL" in done.stderr) is (
        django_lines
    ), done.stderr
    assert f"Task id={bad.id} path=tests.tasks.fail state=FAILED" in done.stderr, done.stderr
    assert "ValueError: shown" in done.stderr


def test_help_shows_examples_metavars_and_the_log_level() -> None:
    done = manage("tasks_worker", "--help")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "examples:" in out and "tasks_worker -Q emails,reports -c 50" in out
    # Python 3.13's argparse names the metavar once ("-c, --concurrency N"), older ones twice.
    assert re.search(r"-c( N)?, --concurrency N", out) and "--poll-interval S" in out
    assert re.search(r"-l( LEVEL)?, --loglevel LEVEL", out) and "--metrics-host HOST" in out
    assert "CONCURRENCY" not in out and "MAX_TASKS" not in out


@pytest.mark.parametrize("command", ["tasks_worker", "tasks_status", "tasks_prune"])
def test_version_is_this_package_s_not_django_s(command: str) -> None:
    from django_sqltasks import __version__

    done = manage(command, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"django-sqltasks {__version__}"


# Start-up when the database cannot be reached ---------------------------------------------


def url_for_port(port: int) -> str:
    settings = connection.settings_dict
    scheme = {"postgresql": "postgres", "mysql": "mysql"}[connection.vendor]
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    return f"{scheme}://{settings['USER']}{password}@127.0.0.1:{port}/{settings['NAME']}"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


needs_a_server = pytest.mark.skipif(
    "connection.vendor == 'sqlite'", reason="SQLite has no server to be unreachable"
)


@needs_a_server
@pytest.mark.django_db  # the worker reaches no database: no row to share
def test_an_unreachable_database_is_one_line_naming_host_port_and_error() -> None:
    port = closed_port()
    done = manage("tasks_worker", "--burst", env={"DATABASE_URL": url_for_port(port)})
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("CommandError: Cannot connect to database 'default' "), lines
    assert f"127.0.0.1:{port}" in lines[0] and "--wait-for-database" in lines[0]


class LateProxy:
    """A TCP port whose connections are dropped at once until ``delay`` seconds have passed and
    at least one connection was dropped, then forwarded to ``target``: a database that comes up
    after the worker first tried it, however long the worker takes to start."""

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        self.target = target
        self.dropped = 0  # connections refused so far; written by the proxy's thread only
        self.stopped = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, args=(delay,), daemon=True)
        self.thread.start()

    def _serve(self, delay: float) -> None:
        up_at = time.monotonic() + delay
        with self.server as server:
            server.settimeout(0.2)
            while not self.stopped.is_set():
                try:
                    client, _ = server.accept()
                except TimeoutError:
                    continue
                if self.dropped == 0 or time.monotonic() < up_at:
                    self.dropped += 1  # the database is not up yet
                    client.close()
                    continue
                upstream = socket.create_connection(self.target)
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass  # the other side closed: so does this one
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()


@pytest.fixture
def late_database() -> Iterator[LateProxy]:
    settings = connection.settings_dict
    proxy = LateProxy((settings["HOST"] or "127.0.0.1", int(settings["PORT"])), delay=2.0)
    yield proxy
    proxy.stopped.set()
    proxy.thread.join(5)


@needs_a_server
@pytest.mark.worker_process
@pytest.mark.django_db(transaction=True)
def test_wait_for_database_retries_until_the_database_is_up(late_database: LateProxy) -> None:
    result = tasks.add.enqueue(20, 22)
    started = time.monotonic()
    done = manage(
        "tasks_worker",
        "--burst",
        "--wait-for-database",
        "30",
        env={"DATABASE_URL": url_for_port(late_database.port)},
    )
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started >= 2.0
    assert "trying again in" in done.stderr, done.stderr
    assert tasks.add.get_result(result.id).return_value == 42


@needs_a_server
@pytest.mark.django_db  # the worker reaches no database: no row to share
def test_wait_for_database_gives_up_after_its_time() -> None:
    started = time.monotonic()
    done = manage(
        "tasks_worker",
        "--burst",
        "--wait-for-database",
        "1.5",
        env={"DATABASE_URL": url_for_port(closed_port())},
    )
    assert done.returncode == 1
    assert 1.5 <= time.monotonic() - started < 20
    assert done.stderr.count("trying again in") >= 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("CommandError: Cannot connect")


# --metrics-host ------------------------------------------------------------------------------


def answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.worker_process
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "listening", "not_listening"),
    [([], "127.0.0.1", "127.0.0.2"), (["--metrics-host", "127.0.0.2"], "127.0.0.2", "127.0.0.1")],
)
def test_metrics_listen_on_metrics_host_only(
    worker_process: StartWorker, args: list[str], listening: str, not_listening: str
) -> None:
    pytest.importorskip("prometheus_client")
    port = closed_port()
    worker = worker_process("--metrics-port", str(port), *args)
    try:
        wait_for(lambda: answers(listening, port), timeout=30)
    except AssertionError:
        raise AssertionError(worker.output) from None
    assert not answers(not_listening, port)


def test_a_single_worker_process_does_not_load_the_supervisor() -> None:
    """Start-up: the command's module leaves the supervisor's (and the pipe's) modules out
    until --processes (or --supervisor) asks for them."""
    code = (
        "import sys, django; django.setup()\n"
        "import django_sqltasks.management.commands.tasks_worker\n"
        "print(sorted(m for m in sys.modules if m.startswith('django_sqltasks.worker.processes')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=worker_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded = done.stdout.strip()
    assert "supervisor" not in loaded and ".pipe" not in loaded, loaded


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
        (["-X", "nosuch"], "--exclude-queues: 'nosuch' is not a queue"),
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


WRONG_PATH = {
    "default": {"BACKEND": "django_sqltasks.SQLTasksBackend"},  # "Tasks": a typo
    "other": {"BACKEND": "django_sqltasks.backend.SQLTaskBackend", "QUEUES": ["x" * 300]},
}


def test_the_worker_blames_the_tasks_entry_not_a_flag_nobody_passed() -> None:
    with override_settings(TASKS=WRONG_PATH), pytest.raises(CommandError) as caught:
        call_command("tasks_worker", "--burst")
    assert str(caught.value).startswith("TASKS['default']: Could not find backend ")


def test_an_unknown_alias_blames_the_flag_and_lists_the_aliases() -> None:
    with pytest.raises(CommandError) as caught:
        call_command("tasks_worker", "--burst", "--backend", "nope")
    assert str(caught.value).startswith("--backend: 'nope' is not in TASKS (its aliases: ")
    assert "'default'" in str(caught.value)
