"""The worker's event loop, run so that its stop starts no thread.

``asyncio.run`` starts threads at the end: the loop's default executor (``asyncio.to_thread``,
which the worker's shutdown uses to wait for its writes and threads) starts its first on first
use, and closing the loop starts one more to join the executor. The embedded worker stops when
its process exits (Ctrl-C, runserver's reload), and from Python 3.12 on no thread may start then
("can't create new thread at interpreter shutdown"): its stop failed half-way, leaving its
running tasks for the rescue. Here the default executor's threads are started with the loop,
and joined by the thread that ran it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# Threads of the loop's default executor, all started with the loop: the worker's shutdown
# awaits one call at a time (outcomes written, upkeep joined, task threads stopped).
DEFAULT_EXECUTOR_THREADS = 2


def started_executor(threads: int = DEFAULT_EXECUTOR_THREADS) -> ThreadPoolExecutor:
    """A thread pool whose ``threads`` threads have all started (a pool starts each on first
    need; these may be needed when no thread can start)."""
    executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sqltasks-loop")
    barrier = threading.Barrier(threads + 1)
    waits = [executor.submit(barrier.wait) for _ in range(threads)]
    barrier.wait()  # every thread is in: each submit above had to start one
    for wait in waits:
        wait.result()
    return executor


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on a new event loop, as ``asyncio.run`` does, with a default executor whose
    threads are started first and joined here at the end."""
    executor = started_executor()
    loop = asyncio.new_event_loop()
    loop.set_default_executor(executor)
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(main)
    finally:
        try:
            _cancel_left(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()  # shuts the default executor down without waiting: no thread
            executor.shutdown(wait=True)


def _cancel_left(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks still pending on ``loop`` and let them end, as ``asyncio.run`` does."""
    left = asyncio.all_tasks(loop)
    if not left:
        return
    for task in left:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    for task in left:
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler(
                {
                    "message": "unhandled exception during the worker's shutdown",
                    "exception": task.exception(),
                    "task": task,
                }
            )
