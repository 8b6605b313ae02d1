"""The worker's threads: a pool that runs sync tasks, and one that runs the task signals' receivers.

Both are used from several threads: every method here is safe to call from any of them.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple

from django.db import connections

from .thread_connections import (
    close_used_connections,
    drop_ended_connections,
    release_used_connections,
)

logger = logging.getLogger("django_sqltasks")

_STOP = object()
MIN_THREADS = 2  # started up front; more are added only when tasks wait
# Share of one CPU the process used since the pool last looked, above which its threads are
# taken to wait for the GIL, not for I/O: more threads would only wait with them.
GIL_BUSY = 0.75
LOOK_MAX_AGE = 1.0  # seconds; an older look may span time the threads were idle
# Share of the time every task thread spent on a CPU, from which they are taken to run at once
# (tasks that release the GIL: NumPy, hashing, compression), so more could use more CPUs.
PARALLEL = 0.9
# Seconds a task thread waits for its next task with the connection its last one left open,
# before it closes it (CONN_MAX_AGE = 0; see release_used_connections): longer than the gaps
# between a busy worker's claims, short enough that an idle worker holds nothing for long.
IDLE_CLOSE = 1.0
_TIMED_OUT = object()


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
    --concurrency 100 worker ran such tasks on two threads. A thread keeps its database
    connection from one task to the next, and closes it as Django would after a request once
    it has waited ``IDLE_CLOSE`` for one (``release_used_connections``), and when it exits.

    A queue that waits is not enough, though: on a machine short of CPU, or with the GIL
    busy, fast tasks wait too, and threads added then only wait with them (a NoOp run on a
    loaded machine grew to 200 threads and cost 75 µs of CPU a task instead of 45). So threads
    are added only when the ones there are blocked (see ``_blocked``).
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
        # Tasks taken (a counter the threads bump without the lock: a lost bump still shows
        # progress), and the last look of ``_blocked``, both the claim loop's.
        self._taken = 0
        self._last_look: _Look | None = None

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
                missing = min(len(self._items), self._size - len(self._threads))
                threads = list(self._threads)
            if missing > 0 and self._blocked(threads):
                with self._ready:
                    for _ in range(min(len(self._items), self._size - len(self._threads))):
                        self._start_thread()
        return True

    def _blocked(self, threads: list[threading.Thread]) -> bool:
        """Whether the task threads are blocked, judged since the last look (the first look
        only starts the count): asleep longer than they waited for a CPU, and either no task
        taken at all (every thread held by a task, whatever it does) or asleep at least half
        the time while the process used less than ``GIL_BUSY`` of a CPU. Linux's per-thread
        scheduler counts tell asleep from waiting for a CPU; where they cannot be read, a
        waiting queue is enough, as it was."""
        look = _Look(time.monotonic(), time.process_time(), self._taken, _sched_times(threads))
        return self._judge(look)

    def _judge(self, look: _Look) -> bool:
        """``_blocked``, from what it saw now and at the last look."""
        last, self._last_look = self._last_look, look
        if look.sched is None:
            return True
        if last is None or look.at - last.at > max(LOOK_MAX_AGE, 4 * self.spawn_after):
            return False  # a first look, or one that may span idle time: judge at the next
        wall = look.at - last.at
        if wall <= 0:
            return False
        ran = waited = 0.0
        counted = 0
        for ident, (run, queued) in look.sched.items():
            before = last.sched.get(ident) if last.sched is not None else None
            if before is not None:
                ran += run - before[0]
                waited += queued - before[1]
                counted += 1
        if counted == 0:
            return False
        used = (look.cpu - last.cpu) / wall  # CPUs the process kept busy
        if ran >= counted * wall * PARALLEL and used + 1 <= _cpus():
            return True  # every thread on a CPU at once (tasks that free the GIL), CPUs left
        asleep = counted * wall - ran - waited
        if asleep <= waited:  # short of a CPU, not blocked
            return False
        if look.taken == last.taken:  # every thread held by a task
            return True
        return asleep >= counted * wall / 2 and used < GIL_BUSY

    def _start_thread(self) -> None:
        thread = threading.Thread(
            target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _take(self, holding: bool) -> Any:
        """The next task; ``holding``: the last one left a connection open, which is closed
        after ``IDLE_CLOSE`` without a task."""
        try:
            item = self._items.popleft()  # atomic: no lock, no wake-up, while work is queued
        except IndexError:
            item = self._wait(IDLE_CLOSE if holding else None)
            if item is _TIMED_OUT:
                close_used_connections()  # outside the lock: it may talk to the server
                item = self._wait(None)
        self._taken += 1
        return item

    def _wait(self, timeout: float | None) -> Any:
        """Wait for a queued task and take it; ``_TIMED_OUT`` if none came in ``timeout``."""
        with self._ready:
            while not self._items:
                self._idle += 1
                try:
                    notified = self._ready.wait(timeout)
                finally:
                    self._idle -= 1
                if not notified and not self._items:
                    return _TIMED_OUT
            return self._items.popleft()

    def _run(self) -> None:
        holding = False  # whether the last task left a connection open for the next
        try:
            while True:
                item = self._take(holding)
                if item is _STOP:
                    return
                fn, arg, _ = item
                try:
                    if holding:
                        drop_ended_connections()
                    fn(arg)
                except BaseException:  # fn handles task errors; this is a bug, keep the thread
                    logger.exception("Unexpected error on a task thread")
                finally:
                    holding = release_used_connections()
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


class _Look(NamedTuple):
    """What ``TaskThreads._blocked`` saw: when, the process's CPU time, the tasks taken, and
    each task thread's seconds on a CPU and waiting for one (None: not readable here)."""

    at: float
    cpu: float
    taken: int
    sched: dict[int, tuple[float, float]] | None


def _cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _sched_times(threads: list[threading.Thread]) -> dict[int, tuple[float, float]] | None:
    """Each thread's seconds run on a CPU and waiting in a run queue (Linux's schedstat), by
    native id; None where the counts cannot be read."""
    times: dict[int, tuple[float, float]] = {}
    for thread in threads:
        ident = thread.native_id
        if ident is None:  # not started yet
            continue
        try:
            with open(f"/proc/self/task/{ident}/schedstat", "rb") as f:
                run, queued = f.read().split()[:2]
        except FileNotFoundError:  # the thread has exited
            continue
        except (OSError, ValueError):  # not Linux, or no schedstat: cannot tell
            return None
        times[ident] = (int(run) / 1e9, int(queued) / 1e9)
    return times


class ReceiverThread:
    """The thread that runs the receivers of Django's task signals (``task_started`` of async
    tasks, ``task_finished``): posted callables, in order, off the event loop. Named
    ``sqltasks-receiver`` in logs and profiles; it handles no OS signal."""

    def __init__(self, name: str = "sqltasks-receiver") -> None:
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
