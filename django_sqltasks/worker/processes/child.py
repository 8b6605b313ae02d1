"""A supervisor's worker processes: how each is started, what the supervisor knows of it from
its pipe (its running tasks and their deadlines, its last heartbeat), and the set of them with
the selector that waits on their pipes."""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ...exceptions import TaskTimeout
from .. import events
from ..relayed import MORE, socket_pair, split_lines
from .pipe import Beat, Event, TaskEnded, TaskRan, split

logger = logging.getLogger("django_sqltasks")

# Seconds an async task past its timeout has for its own loop to cancel it and report its end,
# before the supervisor stops its process (the task blocks the loop, or ignores the cancel).
ASYNC_GRACE = 2.0
READ_BYTES = 65536  # read from a child's pipe at once


@dataclass(eq=False)
class Child:
    """One worker process; every field is the supervisor thread's."""

    worker_id: str
    proc: subprocess.Popen[bytes]
    reader: int  # the read end of the child's pipe
    born: float  # time.monotonic()
    buffer: bytes = b""
    last_beat: float | None = None  # None until the child has registered
    beat_ok: bool = True  # False while the child withholds its lease (it cannot progress)
    claimed: int = 0
    running: dict[uuid.UUID, float | None] = field(default_factory=dict)  # task: timeout
    deadlines: dict[uuid.UUID, float] = field(default_factory=dict)  # monotonic
    retiring: bool = False  # a replacement was started; this one stops by itself or on SIGTERM
    killed_at: float | None = None  # when a forced stop sent SIGTERM again
    # The supervisor's end of the socket that wakes the child, when the supervisor listens for
    # it (``relay``), and what was read from it and not yet handled.
    wakes: socket.socket | None = None
    wakes_buffer: bytes = b""

    @classmethod
    def start(cls, worker_id: str, command: list[str], relayed: bool = False) -> Child:
        """Start ``python -m django tasks_worker COMMAND`` as ``worker_id``, with a pipe back
        (and, ``relayed``, a socket through which the supervisor wakes it)."""
        wakes, wake_fd = socket_pair() if relayed else (None, None)
        reader, writer = os.pipe()
        os.set_blocking(reader, False)
        env = dict(os.environ)
        # The child imports the project as this process did (manage.py's directory).
        paths = [sys.path[0]] if sys.path and sys.path[0] else []
        env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
        argv = [sys.executable, "-m", "django", "tasks_worker", *command]
        link = f"{writer},{os.getpid()}" + ("" if wake_fd is None else f",{wake_fd}")
        argv += ["--worker-id", worker_id, "--supervisor", link]
        passed = (writer,) if wake_fd is None else (writer, wake_fd)
        # A session of its own: a terminal's Ctrl-C reaches the supervisor alone, which then
        # stops each child once (not twice, which would force it).
        try:
            proc = subprocess.Popen(argv, env=env, pass_fds=passed, start_new_session=True)
        finally:
            for fd in passed:
                os.close(fd)
        return cls(
            worker_id=worker_id, proc=proc, reader=reader, born=time.monotonic(), wakes=wakes
        )

    def wake(self, line: bytes) -> bool:
        """Send ``line`` down the wake-up socket; False if it could not go (full, or gone)."""
        if self.wakes is None:
            return False
        try:
            self.wakes.send(line)
        except (BlockingIOError, OSError):
            return False
        return True

    def read_wakes(self) -> int:
        """How many "more may wait" lines the child sent since the last read."""
        assert self.wakes is not None
        try:
            data = self.wakes.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError, OSError):
            return 0
        lines, self.wakes_buffer = split_lines(self.wakes_buffer + data)
        return sum(1 for line in lines if line == MORE)

    def read(self) -> list[Event] | None:
        """The events the child wrote since the last read (none if a line is not whole yet);
        None if there is nothing to read now. Raise ``EOFError`` once the child is gone."""
        try:
            data = os.read(self.reader, READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return None
        if not data:
            raise EOFError
        events, self.buffer = split(self.buffer + data)
        return events

    def note(self, event: TaskRan | TaskEnded | Beat) -> None:
        """Record what ``event`` says of the child's tasks or of its heartbeat."""
        now = time.monotonic()
        match event:
            case TaskRan(task_id, timeout, on_loop):
                self.running[task_id] = timeout
                if timeout is not None:
                    # An async task's loop enforces its timeout; the process is stopped only if
                    # the loop has not ended it a little later.
                    self.deadlines[task_id] = now + timeout + (ASYNC_GRACE if on_loop else 0.0)
            case TaskEnded(task_id):
                self.running.pop(task_id, None)
                self.deadlines.pop(task_id, None)
            case Beat(renewed, claimed):
                self.last_beat, self.beat_ok, self.claimed = now, renewed, claimed

    def overdue(self, now: float) -> dict[uuid.UUID, TaskTimeout]:
        """The running tasks past their deadline, each with the error it fails with."""
        return {
            task_id: TaskTimeout(
                f"The task ran longer than its timeout of {self.running[task_id]}s; its "
                "worker process was stopped."
            )
            for task_id, at in self.deadlines.items()
            if at <= now
        }

    def healthy(self, lease_timeout: float) -> bool:
        """Whether the child has registered, keeps its lease, and heartbeats (or is busy in a
        task, which may hold the GIL)."""
        if self.last_beat is None or not self.beat_ok:
            return False
        return bool(self.running) or time.monotonic() - self.last_beat <= lease_timeout


class Children:
    """The worker processes of one supervisor, each known by the read end of its pipe, and the
    selector that waits on those pipes and on the wake-up pipe of signals. Every field is the
    supervisor thread's."""

    def __init__(self, worker_id: str, command: list[str]) -> None:
        self._worker_id = worker_id
        self._command = command  # the children's tasks_worker options
        self.relayed = False  # set before the first start: each child gets a wake-up socket
        self._by_reader: dict[int, Child] = {}
        self._by_wakes: dict[int, Child] = {}  # by the fd of the supervisor's end of its socket
        self._watched: dict[int, Callable[[], None]] = {}  # other fds, and what reads them
        self.more: list[Child] = []  # children that said more tasks may wait, since last taken
        self.on_started: Callable[[Child], None] | None = None  # told of each child started
        self._selector = selectors.DefaultSelector()
        self._started = 0  # children started: the next one's id suffix
        self._wake_reader: int | None = None

    def __len__(self) -> int:
        return len(self._by_reader)

    def __contains__(self, child: Child) -> bool:
        """Whether ``child`` still runs here (not killed nor forgotten)."""
        return self._by_reader.get(child.reader) is child

    def all(self) -> list[Child]:
        """The children, in a list of their own: the caller may forget some on the way."""
        return list(self._by_reader.values())

    def start(self) -> Child:
        """Start the next child, ``worker_id``-N."""
        self._started += 1
        child = Child.start(f"{self._worker_id}-{self._started}", self._command, self.relayed)
        self._by_reader[child.reader] = child
        self._selector.register(child.reader, selectors.EVENT_READ)
        if child.wakes is not None:
            self._by_wakes[child.wakes.fileno()] = child
            self._selector.register(child.wakes.fileno(), selectors.EVENT_READ)
        logger.info(
            "Started worker process pid=%d worker_id=%s",
            child.proc.pid,
            child.worker_id,
            extra={"action": "child_start", "worker_id": child.worker_id},
        )
        events.emit("child_started", worker_id=child.worker_id, pid=child.proc.pid)
        if self.on_started is not None:
            self.on_started(child)
        return child

    def wake_on_signals(self) -> None:
        """Have a signal end the wait of ``ready`` (the handler itself runs between ticks)."""
        reader, writer = os.pipe()
        os.set_blocking(reader, False)
        os.set_blocking(writer, False)
        self._selector.register(reader, selectors.EVENT_READ)
        self._wake_reader = reader
        signal.set_wakeup_fd(writer)

    def ready(self, timeout: float) -> list[Child]:
        """Wait up to ``timeout`` seconds for children that wrote, or for a signal."""
        ready = []
        for key, _ in self._selector.select(timeout):
            if key.fd == self._wake_reader:
                _drain(key.fd)
            elif key.fd in self._watched:
                self._watched[key.fd]()
            elif key.fd in self._by_wakes:
                child = self._by_wakes[key.fd]
                self.more.extend([child] * child.read_wakes())
            else:
                ready.append(self._by_reader[key.fd])
        return ready

    def watch(self, fd: int, on_readable: Callable[[], None]) -> None:
        """Call ``on_readable`` when ``fd`` is readable, within ``ready``'s wait."""
        self._watched[fd] = on_readable
        self._selector.register(fd, selectors.EVENT_READ)

    def unwatch(self, fd: int) -> None:
        if self._watched.pop(fd, None) is not None:
            self._selector.unregister(fd)

    def closed(self, child: Child) -> None:
        """Stop waiting on the pipe of ``child``, which closed it (it is gone)."""
        if child.reader in self._selector.get_map():
            self._selector.unregister(child.reader)

    def forget(self, child: Child) -> None:
        """Forget ``child``, which has exited or was killed, and close its pipe."""
        self.closed(child)
        os.close(child.reader)
        del self._by_reader[child.reader]
        if child.wakes is not None:
            fd = child.wakes.fileno()
            self._selector.unregister(fd)
            del self._by_wakes[fd]
            child.wakes.close()

    def kill(self, child: Child) -> None:
        """Kill ``child`` (SIGKILL), wait for it, and forget it."""
        child.proc.kill()
        child.proc.wait()
        self.forget(child)

    def signal_all(self, signum: int) -> None:
        for child in self._by_reader.values():
            if child.proc.poll() is None:
                child.proc.send_signal(signum)


def _drain(fd: int) -> None:
    while True:
        try:
            if not os.read(fd, 512):
                return
        except BlockingIOError:
            return
