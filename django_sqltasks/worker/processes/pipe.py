"""The pipe from each worker process to its supervisor (``tasks_worker --processes``): the events
a child sends, its end of the pipe (``SupervisorLink``), and their reading by the supervisor.

The child reports, one JSON line per event, what only it knows: each task's start (with its
timeout, and whether it runs on the event loop) and end, a cancel request for a running sync
task, and each heartbeat. The supervisor decides from these alone (it never waits on the
child), so a task that holds the GIL, and starves every thread of its process, keeps its lease
and is still stopped at its deadline, whether it is sync or async.

The worker's executor knows the child's end only as a ``TaskWatch`` (``worker/executor.py``): a
worker process knows nothing of the supervisor above it.
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
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("django_sqltasks")

PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True, slots=True)
class TaskRan:
    """A task's function is about to run; the supervisor enforces ``timeout`` (seconds) for a
    sync task, and for an async one (``on_loop``) a little after its loop should have."""

    task_id: uuid.UUID
    timeout: float | None
    on_loop: bool = False


@dataclass(frozen=True, slots=True)
class TaskEnded:
    """A task's function returned (or raised)."""

    task_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class CancelAsked:
    """A user asked to cancel a running sync task: only the supervisor can stop it."""

    task_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Beat:
    """A heartbeat: whether the lease was renewed, and the tasks claimed so far."""

    renewed: bool
    claimed: int


Event = TaskRan | TaskEnded | CancelAsked | Beat


def encode(event: Event) -> bytes:
    """One line of the pipe (short enough to be written whole: under PIPE_BUF)."""
    fields: dict[str, Any]
    match event:
        case TaskRan(task_id, timeout, on_loop):
            fields = {"e": "run", "id": str(task_id), "timeout": timeout}
            if on_loop:
                fields["on_loop"] = True
        case TaskEnded(task_id):
            fields = {"e": "end", "id": str(task_id)}
        case CancelAsked(task_id):
            fields = {"e": "cancel", "id": str(task_id)}
        case Beat(renewed, claimed):
            fields = {"e": "beat", "ok": renewed, "claimed": claimed}
    return (json.dumps(fields) + "\n").encode()


def decode(line: bytes) -> Event:
    """The event of one line; raise ``ValueError`` for a line no child writes."""
    fields = json.loads(line)
    kind = fields["e"]
    if kind == "run":
        return TaskRan(uuid.UUID(fields["id"]), fields["timeout"], bool(fields.get("on_loop")))
    if kind == "end":
        return TaskEnded(uuid.UUID(fields["id"]))
    if kind == "cancel":
        return CancelAsked(uuid.UUID(fields["id"]))
    if kind == "beat":
        return Beat(fields["ok"], fields["claimed"])
    raise ValueError(f"Unknown event on a worker process's pipe: {kind!r}")


def split(buffer: bytes) -> tuple[list[Event], bytes]:
    """The events of the whole lines in ``buffer``, and the rest (a line not ended yet)."""
    *lines, rest = buffer.split(b"\n")
    return [decode(line) for line in lines], rest


class SupervisorLink:
    """The child's end of the pipe: send events to the supervisor. A ``TaskWatch``; any thread
    may call every method."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()  # one line per write, lines never interleaved
        self._running: set[uuid.UUID] = set()  # sync tasks whose function runs; behind _lock
        self._broken = False  # behind _lock

    def sync_started(self, task_id: uuid.UUID, timeout: float | None) -> None:
        """A sync task's function is about to run (the supervisor enforces ``timeout``)."""
        with self._lock:
            self._running.add(task_id)
        self.send(TaskRan(task_id, timeout))

    def sync_ended(self, task_id: uuid.UUID) -> None:
        with self._lock:
            self._running.discard(task_id)
        self.send(TaskEnded(task_id))

    def async_started(self, task_id: uuid.UUID, timeout: float | None) -> None:
        """An async task's coroutine is about to run. Its loop enforces ``timeout`` and its
        cancellation; the supervisor renews the lease while it runs (it may block the loop
        and hold the GIL), and stops the process if the loop has not ended it shortly after
        its timeout."""
        self.send(TaskRan(task_id, timeout, on_loop=True))

    def async_ended(self, task_id: uuid.UUID) -> None:
        self.send(TaskEnded(task_id))

    def cancel(self, task_id: uuid.UUID) -> bool:
        """Ask the supervisor to stop a running sync task; False if none runs here."""
        with self._lock:
            if task_id not in self._running:
                return False
        self.send(CancelAsked(task_id))
        return True

    def beat(self, renewed: bool, claimed: int) -> None:
        """Report a heartbeat: whether the lease was renewed, and the tasks claimed so far."""
        self.send(Beat(renewed, claimed))

    def send(self, event: Event) -> None:
        line = encode(event)
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
