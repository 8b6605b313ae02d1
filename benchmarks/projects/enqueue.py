"""Enqueue one task from async code the way each system's users do."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async

from benchmarks.systems import current_system


async def aenqueue(task: Any, *args: Any) -> None:
    """``await task.aenqueue()`` for Django Tasks backends, ``sync_to_async(delay)`` for Celery."""
    if current_system().enqueue_kind == "celery":
        await sync_to_async(task.delay)(*args)
    else:
        await task.aenqueue(*args)
