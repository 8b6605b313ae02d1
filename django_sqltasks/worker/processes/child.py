"""One worker process of a supervisor: how it is started, and what the supervisor knows of it,
from its pipe (its running tasks and their deadlines, its last heartbeat)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field

from ...exceptions import TaskTimeout
from .pipe import Beat, Event, TaskEnded, TaskRan, split

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

    @classmethod
    def start(cls, worker_id: str, command: list[str]) -> Child:
        """Start ``python -m django tasks_worker COMMAND`` as ``worker_id``, with a pipe back."""
        reader, writer = os.pipe()
        os.set_blocking(reader, False)
        env = dict(os.environ)
        # The child imports the project as this process did (manage.py's directory).
        paths = [sys.path[0]] if sys.path and sys.path[0] else []
        env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
        argv = [sys.executable, "-m", "django", "tasks_worker", *command]
        argv += ["--worker-id", worker_id, "--supervisor", f"{writer},{os.getpid()}"]
        # A session of its own: a terminal's Ctrl-C reaches the supervisor alone, which then
        # stops each child once (not twice, which would force it).
        proc = subprocess.Popen(argv, env=env, pass_fds=(writer,), start_new_session=True)
        os.close(writer)
        return cls(worker_id=worker_id, proc=proc, reader=reader, born=time.monotonic())

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
