"""Start worker processes from a process that has already imported Django.

A fresh ``python -m django tasks_worker`` spends about 0.35 s of CPU importing Django, asyncio,
psycopg and the rest before it reads its settings; the suite starts over a hundred of them.
Forked, a worker that finds no task costs about 0.3 s of CPU from its start to its exit, against
1.1 s exec'd (0.7 s forked before the server froze its objects: see ``main``).
The fork server is a process of its own, started once per test process, that imports those
libraries (never the settings, the apps or this project, which read the environment) and then
forks a child for each worker a test starts. The child sets the environment, the working
directory and the output the test asked for, and runs ``python -m django tasks_worker ...``
exactly as the command line would, with the same settings module read fresh: what differs from
an exec is only that the libraries were imported before the fork.

A start whose environment changes how Python itself starts (``LD_PRELOAD`` for libfaketime,
``PYTHON*`` variables) execs a fresh interpreter instead, as does every start when
``SQLTASKS_TEST_FORKSERVER=0``. The worker's own children (a supervisor's) are always exec'd by
the worker's code, as in production.

Protocol, one JSON object per line on a socket pair: the test sends ``{"argv", "env", "cwd",
"stdout", "stderr"}`` (paths of files to append the output to), or ``"pipes": true`` with the
write ends of two pipes passed along the line (``SCM_RIGHTS``) for a command whose reader the
test plays; the server answers ``{"started": pid}`` and later ``{"exited": pid, "code": n}`` (a
negative ``n`` is the signal that ended it, as ``subprocess.Popen.returncode`` says).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ENABLED_ENV = "SQLTASKS_TEST_FORKSERVER"

# What a worker imports before it reads its settings (python -X importtime), and none of it
# reads the settings at import. The server checks that: it imports these with
# DJANGO_SETTINGS_MODULE unset, so a module that read the settings would fail to import.
PRELOAD = (
    "asyncio",
    "concurrent.futures",
    "decimal",
    "json",
    "logging",
    "ssl",
    "uuid",
    "zoneinfo",
    "asgiref.sync",
    "django.core.management",
    "django.core.management.base",
    "django.core.checks",
    "django.core.serializers.json",
    "django.db.models",
    "django.db.backends.base.base",
    "django.db.backends.sqlite3.base",
    "django.db.backends.postgresql.base",
    "django.db.backends.mysql.base",
    "django.tasks",
    "django.tasks.base",
    "django.tasks.backends.base",
    "django.contrib.admin",
    "django.forms",
    "django.template",
    "django.template.defaulttags",
    "django.utils.timezone",
    "django.views.generic",
    "dj_database_url",
    "psycopg",
    "psycopg.pq",
    "MySQLdb",
    "orjson",
    "croniter",
)

# Variables that change how the interpreter starts, which a fork cannot honour.
EXEC_ONLY_PREFIXES = ("LD_", "PYTHON", "FAKETIME")


def needs_exec(env: dict[str, str], baseline: dict[str, str]) -> bool:
    """Whether ``env`` changes how Python starts compared with ``baseline`` (the fork
    server's), so that a fork of the server would not be the process asked for."""
    for name in set(env) | set(baseline):
        if name.startswith(EXEC_ONLY_PREFIXES) and env.get(name) != baseline.get(name):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# The server


def _child(
    request: dict[str, Any], server: socket.socket, server_fds: list[int], pipes: list[int]
) -> None:
    """In the forked child: become ``python -m django tasks_worker ...`` as the test asked."""
    import runpy  # only the child needs them
    import types

    signal.set_wakeup_fd(-1)
    server.close()
    for fd in server_fds:
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if pipes:
        for fd, given in zip((1, 2), pipes, strict=True):
            os.dup2(given, fd)
            os.close(given)
    else:
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            with open(path, "ab", buffering=0) as out:
                os.dup2(out.fileno(), fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    if "code" in request:
        # python -c: the code, run as __main__, as that process would run it.
        sys.argv = ["-c"]
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(request["code"], "<string>", "exec"), main.__dict__)
        raise SystemExit(0)
    sys.argv = ["django", *request["argv"]]
    # python -m django: the same module, run as __main__; SystemExit ends the child as it would
    # end that process (through the interpreter's own exit: atexit, thread joins, flushes).
    runpy.run_module("django", run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def serve(sock: socket.socket) -> None:
    """Fork a worker for each request on ``sock`` until it closes; then kill the children
    still running."""
    children: set[int] = set()
    reader, waker = os.pipe()
    os.set_blocking(reader, False)
    os.set_blocking(waker, False)
    signal.set_wakeup_fd(waker)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the wakeup fd

    def say(message: dict[str, int]) -> None:
        sock.sendall(json.dumps(message).encode() + b"\n")

    pending = b""
    passed: list[int] = []  # descriptors received with the lines, in order, not yet used
    while True:
        ready, _, _ = select.select([sock, reader], [], [])
        if reader in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(reader, 4096)
            for pid in list(children):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    children.discard(pid)
                    code = os.waitstatus_to_exitcode(status)
                    say({"exited": pid, "code": code})
        if sock in ready:
            data, fds, _, _ = socket.recv_fds(sock, 65536, 16)
            passed.extend(fds)
            if not data:
                break
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pipes = [passed.pop(0), passed.pop(0)] if request.get("pipes") else []
                pid = os.fork()
                if pid == 0:
                    _child(request, sock, [reader, waker, *passed], pipes)
                for fd in pipes:  # the child's now; the test holds the read ends
                    os.close(fd)
                children.add(pid)
                say({"started": pid})
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def main() -> None:
    settings_module = os.environ.pop("DJANGO_SETTINGS_MODULE", None)
    for name in PRELOAD:
        # A library that is not installed here (mysqlclient without WITH_MYSQL=1, which
        # Django's MySQL backend reports as ImproperlyConfigured) is simply not preloaded; the
        # child imports what it needs as any process would, and fails as it would.
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    if settings_module is not None:
        os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    # Out of the collector's reach: a child that collects (at the latest, as it exits) would
    # otherwise walk every object imported here and write to each one's header, copying every
    # page of the server's heap. That was 0.45 s of CPU of each worker's 0.7.
    gc.freeze()
    serve(socket.socket(fileno=int(sys.argv[1])))


# ---------------------------------------------------------------------------------------------
# The client, in the test process


class ForkedProcess:
    """The part of ``subprocess.Popen``'s interface the tests use, for a forked worker."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._server.pump(0)
            self.returncode = self._server.exits.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(["tasks_worker"], timeout or 0)
            self._server.pump(left)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            # It may have exited and been reaped by the fork server since the poll, before
            # the server told us: gone, as Popen.send_signal takes it.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkServer:
    """The test process's end of one fork server (started at first use)."""

    def __init__(self, env: dict[str, str], cwd: str) -> None:
        self.env = env
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
        )
        theirs.close()
        self.sock = ours
        self.exits: dict[int, int] = {}
        self._buffer = b""
        self._lock = threading.Lock()
        self._started: list[int] = []

    def start(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        stdout: str,
        stderr: str,
        code: str | None = None,
        pipes: tuple[int, int] | None = None,
    ) -> ForkedProcess:
        """Fork ``python -m django *argv``, or ``python -c code`` when ``code`` is given; its
        output goes to the files ``stdout`` and ``stderr``, or to ``pipes`` (two descriptors
        open for writing, which the child gets copies of)."""
        request: dict[str, Any] = {
            "argv": argv, "env": env, "cwd": cwd, "stdout": stdout, "stderr": stderr
        }  # fmt: skip
        if code is not None:
            request["code"] = code
        if pipes is not None:
            request["pipes"] = True
        line = json.dumps(request).encode() + b"\n"
        with self._lock:
            if pipes is None:
                self.sock.sendall(line)
            else:  # the descriptors travel with the line's first bytes
                sent = socket.send_fds(self.sock, [line], list(pipes))
                self.sock.sendall(line[sent:])
        while not self._started:
            self.pump(30)
        return ForkedProcess(self, self._started.pop(0))

    def pump(self, timeout: float | None) -> None:
        """Read what the server has said, waiting up to ``timeout`` seconds for the first."""
        with self._lock:
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if not ready:
                return
            data = self.sock.recv(65536)
            if not data:
                raise RuntimeError(f"the fork server ended (exit code {self.proc.poll()})")
            self._buffer += data
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                message = json.loads(line)
                if "started" in message:
                    self._started.append(message["started"])
                else:
                    self.exits[message["exited"]] = message["code"]

    def close(self) -> None:
        self.sock.close()
        self.proc.wait(timeout=30)


_server: ForkServer | None = None


def start_worker(
    args: list[str], env: dict[str, str], baseline: dict[str, str], cwd: str, log: Any
) -> Any:
    """Start ``python -m django tasks_worker *args`` with ``env``: forked from the fork server
    (started with ``baseline``, the environment of a worker no test changed) where that is the
    same process, exec'd otherwise. Returns a Popen or a ``ForkedProcess``."""
    global _server
    argv = ["tasks_worker", *args]
    if os.environ.get(ENABLED_ENV, "1") == "0" or needs_exec(env, baseline):
        return subprocess.Popen(
            [sys.executable, "-m", "django", *argv],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    if _server is None:
        _server = ForkServer(baseline, cwd)
    return _server.start(argv, env, cwd, log.name, log.name)


def popen_django(args: list[str], env: dict[str, str], baseline: dict[str, str], cwd: str) -> Any:
    """Start ``python -m django *args`` with its output to pipes, as ``subprocess.Popen(...,
    stdout=PIPE, stderr=PIPE, text=True)`` would, forked where it can: the process returned
    has ``stdout`` and ``stderr``, the read ends, as text files."""
    argv = [sys.executable, "-m", "django", *args]
    if os.environ.get(ENABLED_ENV, "1") == "0" or needs_exec(env, baseline):
        return subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        process: Any = _fork_server(baseline, cwd).start(
            args, env, cwd, "", "", pipes=(out_write, err_write)
        )
    finally:
        os.close(out_write)
        os.close(err_write)
    process.stdout = open(out_read)  # noqa: SIM115 - the caller closes them, as Popen's
    process.stderr = open(err_read)  # noqa: SIM115
    return process


def _fork_server(baseline: dict[str, str], cwd: str) -> ForkServer:
    global _server
    if _server is None:
        _server = ForkServer(baseline, cwd)
    return _server


def run_django(
    args: list[str], env: dict[str, str], baseline: dict[str, str], cwd: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m django *args`` to its end, as ``subprocess.run(..., capture_output=True,
    text=True, errors="replace")`` would, through the fork server where it can."""
    argv = [sys.executable, "-m", "django", *args]
    return _run(argv, args, None, env, baseline, cwd, timeout)


def run_python(
    code: str, env: dict[str, str], baseline: dict[str, str], cwd: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code`` to its end, as ``run_django`` runs a command."""
    return _run([sys.executable, "-c", code], [], code, env, baseline, cwd, timeout)


def _run(
    argv: list[str],
    args: list[str],
    code: str | None,
    env: dict[str, str],
    baseline: dict[str, str],
    cwd: str,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    global _server
    if os.environ.get(ENABLED_ENV, "1") == "0" or needs_exec(env, baseline):
        return subprocess.run(
            argv,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    if _server is None:
        _server = ForkServer(baseline, cwd)
    with tempfile.TemporaryDirectory(prefix="command-") as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        process = _server.start(args, env, cwd, out, err, code)
        try:
            status = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        return subprocess.CompletedProcess(
            argv,
            status,
            Path(out).read_text(errors="replace") if os.path.exists(out) else "",
            Path(err).read_text(errors="replace") if os.path.exists(err) else "",
        )


def stop_server() -> None:
    global _server
    if _server is not None:
        _server.close()
        _server = None


if __name__ == "__main__":
    main()
