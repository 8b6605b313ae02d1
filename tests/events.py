"""What a test waits on instead of a clock: the events of its workers and of its tasks.

A test's ``EventLog`` receives every signal of ``django_sqltasks.worker.events``, every task's
end (``task_finished``, sent once its outcome is stored), and the ``note`` a test task sends.
From the test's own process it gets them by a direct call; from the worker processes the test
starts, over a Unix datagram socket whose path they are given in SQLTASKS_TEST_EVENTS (their
``tests`` app sends one JSON datagram an event). A thread of the test receives the datagrams;
``wait`` blocks until the events it asks for are in, and fails naming them if they are not in
by its timeout. A ``Gate`` goes the other way: tasks wait at it until the test opens it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from django_sqltasks.compat import task_finished
from django_sqltasks.worker import events

ENV = "SQLTASKS_TEST_EVENTS"  # the path of the test's socket, in its worker processes
WAIT = 60.0  # seconds: a default timeout well past any wait on a busy machine
MAX_DATAGRAM = 1 << 16  # bytes

T = TypeVar("T")


@dataclass(frozen=True)
class Event:
    """One event: its ``name``, its ``fields``, the process that sent it, when
    (``time.monotonic()``, one clock for every process of the machine), and its place in the
    log (``seq``: pass ``seq + 1`` as ``after`` to see the events that came after it)."""

    name: str
    fields: dict[str, Any]
    pid: int
    at: float
    seq: int

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]


def note(what: str, **fields: Any) -> None:
    """Send a test task's ``note`` event (to the test that started its worker, if any)."""
    events.emit("note", what=what, **fields)


class EventLog:
    """The events a test has received, in order; ``wait`` on them. Every method may be called
    from any thread."""

    def __init__(self) -> None:
        # Bound in a short directory of its own: a socket's path has at most 107 bytes.
        self._dir = tempfile.mkdtemp(prefix="sqltasks-", dir="/tmp")
        self.path = os.path.join(self._dir, "events")
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(self.path)
        self._condition = threading.Condition()
        self._events: list[Event] = []  # behind _condition
        self._receiver = threading.Thread(target=self._receive, name="test-events", daemon=True)
        self._receiver.start()

    def record(
        self, name: str, fields: dict[str, Any], pid: int | None = None, at: float | None = None
    ) -> None:
        """Add an event (the listener of the test's own process)."""
        with self._condition:
            event = Event(
                name,
                fields,
                os.getpid() if pid is None else pid,
                time.monotonic() if at is None else at,
                len(self._events),
            )
            self._events.append(event)
            self._condition.notify_all()

    def mark(self) -> int:
        """A position in the log: pass it as ``after`` to see only the events that follow."""
        with self._condition:
            return len(self._events)

    def all(
        self,
        name: str,
        where: Callable[[Event], bool] | None = None,
        *,
        after: int = 0,
        **fields: Any,
    ) -> list[Event]:
        """The events named ``name`` since ``after`` whose fields equal ``fields`` and that
        ``where`` accepts."""
        with self._condition:
            candidates = self._events[after:]
        return self.select(candidates, name, where, fields)

    def wait(
        self,
        name: str,
        where: Callable[[Event], bool] | None = None,
        *,
        count: int = 1,
        after: int = 0,
        timeout: float = WAIT,
        **fields: Any,
    ) -> list[Event]:
        """Block until ``count`` events named ``name`` (as ``all`` selects them) are in;
        return them all. Fail, naming what was awaited and what came, after ``timeout``
        seconds. ``where`` runs once an event, on the calling thread: it may query the
        database."""
        deadline = time.monotonic() + timeout
        found: list[Event] = []
        position = after
        while True:
            with self._condition:
                new = self._events[position:]
            position += len(new)
            found += self.select(new, name, where, fields)
            if len(found) >= count:
                return found
            self._await_more(
                position,
                deadline,
                f"waited {timeout:g}s for {count} {name!r} event(s)"
                + (f" with {fields}" if fields else "")
                + (" that the test's condition accepts" if where else "")
                + f"; {len(found)} came",
            )

    def until(self, condition: Callable[[], T], what: str, *, timeout: float = WAIT) -> T:
        """Block until ``condition()`` (on the calling thread, so it may query the database)
        is true, trying it now and again once after each wake-up by new events of any kind;
        return its value. Fail saying ``what`` was awaited after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.mark()
            value = condition()
            if value:
                return value
            self._await_more(seen, deadline, f"waited {timeout:g}s for {what}")

    def _await_more(self, seen: int, deadline: float, failure: str) -> None:
        """Block until the log holds more than ``seen`` events; past ``deadline``, fail with
        ``failure`` and the last events."""
        with self._condition:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{failure}. The last events: {self._events[-15:]}")
            if len(self._events) == seen:
                self._condition.wait(remaining)

    @staticmethod
    def select(
        candidates: list[Event],
        name: str,
        where: Callable[[Event], bool] | None,
        fields: dict[str, Any],
    ) -> list[Event]:
        return [
            event
            for event in candidates
            if event.name == name
            and all(event.fields.get(key) == value for key, value in fields.items())
            and (where is None or where(event))
        ]

    def close(self) -> None:
        """Stop receiving (an empty datagram ends the receiving thread)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as stopper:
            stopper.sendto(b"", self.path)
        self._receiver.join(timeout=10)
        self._socket.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _receive(self) -> None:
        while data := self._socket.recv(MAX_DATAGRAM):
            event = json.loads(data)
            self.record(event["name"], event["fields"], event["pid"], event["at"])


class Gate:
    """The other way: an event a test gives its tasks. A FIFO at ``path`` that tasks block on
    (``wait_at``) until the test opens it; it stays open after that. The test holds it open
    for writing, so that a task's open never blocks, and what the test wrote stays readable."""

    # The gates not closed yet, so that a failing test can let its tasks through (open_all)
    # before it waits for its worker: a task at a gate never returns by itself.
    _live: ClassVar[set[Gate]] = set()

    def __init__(self, path: str) -> None:
        self.path = path
        os.mkfifo(path)
        self._fd = os.open(path, os.O_RDWR)
        Gate._live.add(self)

    @classmethod
    def open_all(cls) -> None:
        """Open every gate of this process not closed yet (a failing test's, on its way out)."""
        for gate in list(cls._live):
            gate.open()

    def open(self) -> None:
        """Let every task at the gate through, and those that come later (up to thousands)."""
        os.set_blocking(self._fd, False)
        with contextlib.suppress(BlockingIOError):  # full: enough for every task to come
            os.write(self._fd, b"x" * (1 << 16))

    def close(self) -> None:
        """Open the gate (a task still waiting at it would wait forever), then let it go."""
        self.open()
        Gate._live.discard(self)
        os.close(self._fd)


def wait_at(gate: str, *, hold_gil: bool = False) -> None:
    """Block until the test opens the ``Gate`` at path ``gate``. With ``hold_gil``, hold the
    GIL the while (every other thread of the process waits): one read() called through
    ``PyDLL``, which keeps the GIL for the call."""
    fd = os.open(gate, os.O_RDWR)  # read and write: opening never blocks
    try:
        if hold_gil:
            ctypes.PyDLL(None).read(fd, ctypes.create_string_buffer(1), 1)
        else:
            os.read(fd, 1)
    finally:
        os.close(fd)


class Sender:
    """A worker process's listener: sends each event to the test's socket at ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def __call__(self, name: str, fields: dict[str, Any]) -> None:
        event = {"name": name, "fields": fields, "pid": os.getpid(), "at": time.monotonic()}
        data = json.dumps(event, default=str)
        # The test may be gone (a worker process that outlives it): the event goes nowhere.
        with contextlib.suppress(FileNotFoundError, ConnectionRefusedError):
            self._socket.sendto(data.encode(), self.path)


def _on_task_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
    events.emit(
        "task_finished",
        id=str(task_result.id),
        task=task_result.task.module_path,
        status=str(task_result.status),
        worker_ids=task_result.worker_ids,
    )


def connect_task_signals() -> None:
    """Send a ``task_finished`` event for each task this process runs."""
    task_finished.connect(_on_task_finished, dispatch_uid="tests.events.task_finished")


@contextlib.contextmanager
def listening(log: EventLog) -> Iterator[EventLog]:
    """Record this process's events in ``log`` for the ``with`` block."""
    connect_task_signals()
    events.listener = log.record
    try:
        yield log
    finally:
        events.listener = None
        task_finished.disconnect(dispatch_uid="tests.events.task_finished")
