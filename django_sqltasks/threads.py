"""The worker's threads: a pool that runs sync tasks, and one thread that sends signals."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from django.db import close_old_connections, connections

logger = logging.getLogger("django_sqltasks")

_STOP = object()


class TaskThreads:
    """Up to ``size`` threads running sync tasks, started only as the load needs them.

    Lighter than ``ThreadPoolExecutor`` on the hot path: no future per task, one C-level
    queue hand-off. Each thread closes its database connections when it exits.
    """

    def __init__(self, size: int, name: str = "sqltasks-task") -> None:
        self.size = size
        self._name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, fn: Callable[[Any], None], arg: Any) -> None:
        """Run ``fn(arg)`` on a task thread, starting one if none is idle."""
        with self._lock:
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self.size:
                thread = threading.Thread(
                    target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        self._queue.put((fn, arg))

    def _run(self) -> None:
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                fn, arg = item
                try:
                    fn(arg)
                except BaseException:  # fn handles task errors; this is a bug, keep the thread
                    logger.exception("Unexpected error on a task thread")
                finally:
                    close_old_connections()
                with self._lock:
                    self._idle += 1
        finally:
            connections.close_all()

    def stop(self, wait: bool = True) -> None:
        """Let each thread finish its task, close its connections and exit."""
        for _ in self._threads:
            self._queue.put(_STOP)
        if wait:
            for thread in self._threads:
                thread.join()


class SignalThread:
    """One thread that runs posted callables in order (signal sending, off the event loop)."""

    def __init__(self, name: str = "sqltasks-signals") -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def post(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((fn, args, future))
        return future

    def _run(self) -> None:
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                fn, args, future = item
                try:
                    future.set_result(fn(*args))
                except BaseException as e:
                    logger.exception("Unexpected error while sending task signals")
                    future.set_exception(e)
                finally:
                    close_old_connections()
        finally:
            connections.close_all()

    def stop(self, timeout: float | None = None) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout)
