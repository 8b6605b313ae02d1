"""Start subprocesses in their own process group and make sure none outlives the harness."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from benchmarks.systems.base import SUBPROCESS_CWD

STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL

_live: set[subprocess.Popen[bytes]] = set()


def spawn(argv: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session, output to ``log``; it is killed at exit if still alive."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(argv),
            env=env,
            cwd=SUBPROCESS_CWD,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    _live.add(proc)
    return proc


def _signal_all(pgid: int, members: Sequence[psutil.Process], signum: int) -> None:
    """Signal the process group once, and any descendant that left it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
    for member in members:
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            if os.getpgid(member.pid) != pgid:
                member.send_signal(signum)


def stop(proc: subprocess.Popen[bytes], grace: float = STOP_GRACE) -> None:
    """SIGTERM the process group and every descendant, then SIGKILL whatever is left."""
    try:
        root = psutil.Process(proc.pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    _signal_all(proc.pid, family, signal.SIGTERM)
    _, alive = psutil.wait_procs(family, timeout=grace)
    if alive:
        _signal_all(proc.pid, alive, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=grace)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    _live.discard(proc)


def stop_all() -> None:
    for proc in list(_live):
        stop(proc, grace=2.0)


def wait_for_port(host: str, port: int, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    """Block until ``host:port`` accepts connections, or fail if ``proc`` dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on {host}:{port} within {timeout}s")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def install_cleanup() -> None:
    """Stop every child on normal exit and on SIGTERM; Ctrl-C raises KeyboardInterrupt as usual."""
    atexit.register(stop_all)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)


def run_client(module: str, env: dict[str, str], *args: str, timeout: float) -> dict[str, Any]:
    """Run ``python -m MODULE ARGS`` (a scenario's client) with ``env``; return the JSON it
    prints, or raise with the end of its stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        cwd=SUBPROCESS_CWD,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{module} {args[0]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)  # type: ignore[no-any-return]
