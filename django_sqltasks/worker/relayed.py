"""Wake-ups relayed by a supervisor: the worker process of ``tasks_worker --processes`` that does
not ``LISTEN`` itself, and is told of new tasks by its supervisor, which listens once for every
process it runs (``processes/relay.py``), over a socket of their own.

The socket carries one line per message. From the supervisor: ``L`` (it listens: every task
enqueued from now on is told to one of its processes), ``U`` (it does not: poll), ``W`` and a
queue name (a task may wait in that queue; no name: in any). From the worker: ``M`` (a claim
took every task it asked for: more may wait, wake another process).

While its supervisor listens, the supervisor also polls for the process, spreading the polls
over its processes and the other machines (``processes/relay.py``): the process's own poll
waits ``RELAYED_POLL_FACTOR`` times its poll interval, a net beneath the supervisor's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable

logger = logging.getLogger("django_sqltasks")

LISTENING = b"L"
UNHEARD = b"U"
WAKE = b"W"
MORE = b"M"
READ_BYTES = 65536
RELAYED_POLL_FACTOR = 10  # a process's own poll, while its supervisor listens and polls for it


def wake_line(queue_name: str | None) -> bytes:
    """The line that wakes a worker process for ``queue_name`` (None: any queue)."""
    return WAKE + (queue_name or "").encode() + b"\n"


def split_lines(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The whole lines of ``buffer``, and the rest (a line not ended yet)."""
    *lines, rest = buffer.split(b"\n")
    return lines, rest


class RelayedWakeups:
    """The worker's end of the socket. Every method and field belongs to the loop thread."""

    def __init__(
        self,
        fd: int,
        on_wake: Callable[[str | None], None],
        on_listening: Callable[[bool], None] | None = None,
    ) -> None:
        self._socket = socket.socket(fileno=fd)
        self._socket.setblocking(False)
        self._on_wake = on_wake
        self._on_listening = on_listening  # told each time ``listening`` changes
        self._buffer = b""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.listening = False  # the supervisor said it listens (and has not said otherwise)

    def start(self) -> None:
        """Read the supervisor's lines as they come (on the loop thread)."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._socket.fileno(), self._readable)

    def more(self) -> None:
        """Say that a claim took all it asked for: the supervisor wakes another process."""
        with contextlib.suppress(BlockingIOError, OSError):  # full, or gone: a hint only
            self._socket.send(MORE + b"\n")

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._socket.fileno())
            self._loop = None
        self.listening = False
        self._socket.close()

    def _readable(self) -> None:
        try:
            data = self._socket.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            data = b""
            logger.warning("Lost the supervisor's wake-ups (%s); polling", e)
        if not data:  # the supervisor is gone (its children die with it): poll meanwhile
            assert self._loop is not None
            self._loop.remove_reader(self._socket.fileno())
            self._set_listening(False)
            return
        lines, self._buffer = split_lines(self._buffer + data)
        for line in lines:
            kind, rest = line[:1], line[1:]
            if kind == WAKE:
                self._on_wake(rest.decode("utf-8", "replace") or None)
            elif kind == LISTENING:
                self._set_listening(True)
                self._on_wake(None)  # anything enqueued while nobody listened
            elif kind == UNHEARD:
                self._set_listening(False)

    def _set_listening(self, listening: bool) -> None:
        changed, self.listening = listening != self.listening, listening
        if changed and self._on_listening is not None:
            self._on_listening(listening)


def socket_pair() -> tuple[socket.socket, int]:
    """The supervisor's end of a new socket, and the worker's, as a file descriptor for it to
    inherit."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    fd = theirs.detach()
    os.set_inheritable(fd, True)
    return ours, fd
