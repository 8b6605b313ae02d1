"""The worker's threads: a pool that runs sync tasks, and one thread that sends signals.

Both are used from several threads: every method here is safe to call from any of them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from django.db import close_old_connections, connections
from django.db.backends.signals import connection_created

logger = logging.getLogger("django_sqltasks")

_STOP = object()
MIN_THREADS = 2  # started up front; more are added only when tasks wait

# Whether the current thread has opened a database connection: a thread that never did has
# nothing to close after a task, and asking Django costs more than a fast task.
_opened = threading.local()


def _mark_opened(sender: Any, **kwargs: Any) -> None:
    _opened.connection = True


connection_created.connect(_mark_opened, dispatch_uid="django_sqltasks.threads")


def close_used_connections() -> None:
    """``close_old_connections()``, on a thread that has opened a connection."""
    if getattr(_opened, "connection", False):
        close_old_connections()


class TaskThreads:
    """Up to ``size`` threads running sync tasks, added only while queued tasks wait.

    Fast tasks are run back to back by the threads already there, which saves a thread
    hand-off per task: a thread takes the next task without waking anyone, and a batch of
    tasks wakes at most as many idle threads as it has tasks. When tasks block (I/O, sleeps),
    the oldest queued task waits at most ``spawn_after`` seconds (longer than the
    interpreter's switch interval, so that waiting for the GIL does not count as blocking)
    before ``balance()`` adds threads for the queued ones. What counts is how long the task at
    the head of the queue has waited, not how long since a thread last took one: two threads
    taking a 10 ms task every 5 ms between them would otherwise never look blocked, and a
    --concurrency 100 worker ran such tasks on two threads. Each thread closes its database
    connections when it exits.
    """

    def __init__(self, size: int, name: str = "sqltasks-task", spawn_after: float = 0.02) -> None:
        self.spawn_after = spawn_after  # set once, before any task is submitted
        self._name = name
        # Guarded by ``_ready``'s lock: the most threads allowed, the threads started, and how
        # many of them wait for work.
        self._size = size
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._ready = threading.Condition(threading.Lock())
        # (fn, arg, monotonic time queued), or _STOP. Appended under the lock; popped without
        # it by a thread taking its next task (``deque.popleft`` is atomic), so a busy thread
        # needs no lock and wakes nobody.
        self._items: deque[Any] = deque()

    @property
    def size(self) -> int:
        """The most threads allowed now."""
        with self._ready:
            return self._size

    @property
    def started(self) -> int:
        """The threads started so far."""
        with self._ready:
            return len(self._threads)

    def add_stand_in(self) -> None:
        """Allow one more thread, in place of one held by a task past its timeout."""
        with self._ready:
            self._size += 1

    def drop_stand_in(self) -> None:
        """Take back a stand-in allowed by ``add_stand_in`` (its late task has ended)."""
        with self._ready:
            self._size -= 1

    def submit_many(self, fn: Callable[[Any], None], args: Sequence[Any]) -> None:
        """Run ``fn(arg)`` for each of ``args``, in order, on the task threads."""
        if not args:
            return
        queued_at = time.monotonic()
        with self._ready:
            self._items.extend((fn, arg, queued_at) for arg in args)
            for _ in range(min(len(args), MIN_THREADS, self._size) - len(self._threads)):
                self._start_thread()
            if self._idle:
                self._ready.notify(min(self._idle, len(args)))

    def take_queued(self) -> list[Any]:
        """Remove the tasks no thread has taken yet; return their arguments, in order."""
        taken: list[Any] = []
        stops: list[Any] = []
        with self._ready:
            # Popped one by one, in place: a thread taking its next task without the lock gets
            # either that task or none, never one that is also returned here.
            while True:
                try:
                    item = self._items.popleft()
                except IndexError:
                    break
                if item is _STOP:
                    stops.append(item)
                else:
                    taken.append(item[1])
            self._items.extend(stops)
        return taken

    def balance(self) -> bool:
        """Add threads for queued tasks once the oldest has waited ``spawn_after``; return
        whether any still wait."""
        try:
            head = self._items[0]  # a thread may take it meanwhile: then the next is older
        except IndexError:
            return False
        if head is not _STOP and time.monotonic() - head[2] >= self.spawn_after:
            with self._ready:
                for _ in range(min(len(self._items), self._size - len(self._threads))):
                    self._start_thread()
        return True

    def _start_thread(self) -> None:
        thread = threading.Thread(
            target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _take(self) -> Any:
        try:
            item = self._items.popleft()  # atomic: no lock, no wake-up, while work is queued
        except IndexError:
            with self._ready:
                while not self._items:
                    self._idle += 1
                    try:
                        self._ready.wait()
                    finally:
                        self._idle -= 1
                item = self._items.popleft()
        return item

    def _run(self) -> None:
        try:
            while True:
                item = self._take()
                if item is _STOP:
                    return
                fn, arg, _ = item
                try:
                    fn(arg)
                except BaseException:  # fn handles task errors; this is a bug, keep the thread
                    logger.exception("Unexpected error on a task thread")
                finally:
                    close_used_connections()
        finally:
            connections.close_all()

    def stop(self, wait: bool = True) -> None:
        """Let each thread finish its task, close its connections and exit."""
        with self._ready:
            self._items.extend([_STOP] * len(self._threads))
            self._ready.notify_all()
        if wait:
            for thread in self._threads:
                thread.join()


class SignalThread:
    """One thread that runs posted callables in order (signal sending, off the event loop)."""

    def __init__(self, name: str = "sqltasks-signals") -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Start the thread; callables posted before run once it starts."""
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
                    close_used_connections()
        finally:
            connections.close_all()

    def stop(self, timeout: float | None = None) -> None:
        self._queue.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)
