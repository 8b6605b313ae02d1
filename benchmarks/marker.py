"""Worker-side completion marker and the harness-side listener for it.

The worker counts finished tasks in shared memory (so forked work-horses, as RQ uses, count too)
and sends one UDP datagram at the first and at the N-th completion. The harness never asks the
broker or the database whether the queue is empty: some systems ack before they run a task.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

MARKER_ADDR_ENV = "BENCH_MARKER_ADDR"
EXPECTED_ENV = "BENCH_EXPECTED"
# How completions are counted: "body" (the default), by the task itself as its last statement,
# the same for every system and adding no work a system's users would not pay; or "signal", by
# a receiver of each system's task_finished signal (which makes some systems send a signal they
# skip when nothing listens).
COUNT_ENV = "BENCH_COUNT"
COUNT_METHODS = ("body", "signal")

_counter: CompletionCounter | None = None  # this worker's, set once at start (apps.ready)


def install(counter: CompletionCounter) -> None:
    """Make ``counter`` the one ``hit()`` reports to (before any task runs, or forks)."""
    global _counter
    _counter = counter


def count_method() -> str:
    return os.environ.get(COUNT_ENV) or "body"


def hit() -> None:
    """Count one completed task, from inside its body (the "body" method)."""
    if _counter is not None:
        _counter.hit()


class CompletionCounter:
    """Count completions across threads and forks; report the first and the N-th."""

    def __init__(self, address: tuple[str, int], expected: int) -> None:
        self._address = address
        self._expected = expected
        self._count = multiprocessing.Value("q", 0)
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    @classmethod
    def from_env(cls) -> CompletionCounter | None:
        address = os.environ.get(MARKER_ADDR_ENV)
        if not address:
            return None
        host, _, port = address.rpartition(":")
        return cls((host, int(port)), int(os.environ.get(EXPECTED_ENV, "0")))

    def hit(self) -> None:
        with self._count.get_lock():
            self._count.value += 1
            count = int(self._count.value)
        if count == 1:
            self.send("first", count)
        if count == self._expected:
            self.send("done", count)

    def send(self, event: str, count: int) -> None:
        payload = json.dumps({"event": event, "count": count, "t": time.time()})
        self._socket.sendto(payload.encode(), self._address)


def send_probe(port: int, seq: int, enqueued_at: float) -> None:
    """Tell the latency agent that probe ``seq`` started (called from inside the task)."""
    started_at = time.time()
    payload = json.dumps({"seq": seq, "latency": started_at - enqueued_at})
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(payload.encode(), ("127.0.0.1", port))


@dataclass
class MarkerEvents:
    first_at: float | None = None
    done_at: float | None = None
    done_count: int = 0


class MarkerListener:
    """Harness side: a UDP socket the worker reports to."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self._socket.bind(("127.0.0.1", 0))
        self.events = MarkerEvents()

    @property
    def address(self) -> str:
        host, port = self._socket.getsockname()
        return f"{host}:{port}"

    def wait_done(self, deadline: float, alive: Callable[[], bool]) -> bool:
        """Collect events until the N-th completion, the deadline or the worker's death."""
        while self.events.done_at is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not alive():
                return False
            self._socket.settimeout(min(remaining, 0.5))
            try:
                data = self._socket.recv(4096)
            except TimeoutError:
                continue
            event = json.loads(data)
            if event["event"] == "first" and self.events.first_at is None:
                self.events.first_at = event["t"]
            elif event["event"] == "done":
                self.events.done_at = event["t"]
                self.events.done_count = event["count"]
        return True

    def close(self) -> None:
        self._socket.close()
