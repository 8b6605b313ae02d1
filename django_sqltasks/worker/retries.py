"""A worker's database thread, whose calls ride out transient faults (``sql/retries.py``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from ..sql.prepared import worker_thread
from ..sql.retries import run_with_retries

T = TypeVar("T")


class DatabaseThread:
    """A worker's database thread: one connection for its claims, its lease and its upkeep.
    Set up once, here; any thread may call it."""

    def __init__(
        self,
        database: str,
        stopping: threading.Event,
        connection_lost: threading.Event | None = None,
        own_sessions: bool = False,
    ) -> None:
        self.database = database
        # ``own_sessions``: its connections are direct ones, which may carry the worker's
        # session settings (sql/prepared.py).
        self.executor = ThreadPoolExecutor(
            1, thread_name_prefix="sqltasks-db", initializer=worker_thread if own_sessions else None
        )
        self._stopping = stopping  # set when the worker winds down: retries give up sooner
        # Set when the thread's connection is lost (see ``Claims.connection_lost``).
        self._on_lost = connection_lost.set if connection_lost is not None else None

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the thread, riding out transient errors (from the loop)."""
        call = partial(
            run_with_retries,
            self.database,
            partial(fn, *args),
            self._stopping,
            on_lost=self._on_lost,
        )
        return await asyncio.get_running_loop().run_in_executor(self.executor, call)
