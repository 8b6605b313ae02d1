"""A supervised worker's end of its supervisor's pipe (``tasks_worker --processes``).

The child reports, one JSON line per event, what only it knows: each task's start (with its
timeout, and whether it runs on the event loop) and end, a cancel request for a running sync
task, and each heartbeat. The supervisor decides from these alone (it never waits on the
child), so a task that holds the GIL, and starves every thread of its process, keeps its lease
and is still stopped at its deadline, whether it is sync or async.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import signal
import sys
import threading
import uuid
from typing import Any

logger = logging.getLogger("django_sqltasks")

PR_SET_PDEATHSIG = 1  # linux/prctl.h


class SupervisorLink:
    """Send events to the supervisor; any thread may call every method."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()  # one line per write, lines never interleaved
        self._running: set[uuid.UUID] = set()  # sync tasks whose function runs; behind _lock
        self._broken = False  # behind _lock

    def sync_started(self, task_id: uuid.UUID, timeout: float | None) -> None:
        """A sync task's function is about to run (the supervisor enforces ``timeout``)."""
        with self._lock:
            self._running.add(task_id)
        self.send("run", id=str(task_id), timeout=timeout)

    def sync_ended(self, task_id: uuid.UUID) -> None:
        with self._lock:
            self._running.discard(task_id)
        self.send("end", id=str(task_id))

    def async_started(self, task_id: uuid.UUID, timeout: float | None) -> None:
        """An async task's coroutine is about to run. Its loop enforces ``timeout`` and its
        cancellation; the supervisor renews the lease while it runs (it may block the loop
        and hold the GIL), and stops the process if the loop has not ended it shortly after
        its timeout."""
        self.send("run", id=str(task_id), timeout=timeout, on_loop=True)

    def async_ended(self, task_id: uuid.UUID) -> None:
        self.send("end", id=str(task_id))

    def cancel(self, task_id: uuid.UUID) -> bool:
        """Ask the supervisor to stop a running sync task; False if none runs here."""
        with self._lock:
            if task_id not in self._running:
                return False
        self.send("cancel", id=str(task_id))
        return True

    def beat(self, renewed: bool, claimed: int) -> None:
        """Report a heartbeat: whether the lease was renewed, and the tasks claimed so far."""
        self.send("beat", ok=renewed, claimed=claimed)

    def send(self, event: str, **fields: Any) -> None:
        line = (json.dumps({"e": event, **fields}) + "\n").encode()
        with self._lock:
            if self._broken:
                return
            try:
                os.write(self._fd, line)  # under PIPE_BUF: written whole
            except OSError as e:
                self._broken = True
                logger.error("Lost the pipe to the supervisor (%s); it no longer hears us", e)


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel kill this process when its parent dies, even by SIGKILL (Linux)."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the call: nobody will kill us
        os._exit(1)
