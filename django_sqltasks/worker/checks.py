"""What a worker checks before it starts: its arguments, and the database it will use (once,
up front, with an error that names what is wrong)."""

from __future__ import annotations

import socket

from django.db import DatabaseError, connections
from django.utils.crypto import get_random_string

from ..core.bounds import MAX_DELAY, MAX_INTERVAL, is_number
from ..core.columns import MAX_NAME_LENGTH
from ..models import TaskRecord
from ..sql import unsupported_version

MAX_WORKER_ID_LENGTH = MAX_NAME_LENGTH  # WorkerRecord.id


def default_worker_id() -> str:
    """The host name (up to 40 characters), a dash, and 12 random characters."""
    return f"{socket.gethostname()[:40]}-{get_random_string(12)}"


def check_arguments(
    concurrency: int,
    prefetch: int | None,
    max_tasks: int | None,
    poll_interval: float | None,
    shutdown_timeout: float | None,
    worker_id: str | None,
) -> None:
    """Raise ``ValueError`` naming the first of ``Worker``'s arguments out of its bounds."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}.")
    if prefetch is not None and prefetch < 0:
        raise ValueError(f"prefetch must be 0 or more, not {prefetch}.")
    if max_tasks is not None and max_tasks < 1:
        raise ValueError(f"max_tasks must be at least 1, not {max_tasks}.")
    if poll_interval is not None and not is_number(poll_interval, 0, MAX_INTERVAL, above=True):
        raise ValueError(
            f"poll_interval must be a positive number of seconds, at most {MAX_INTERVAL:g}, "
            f"not {poll_interval!r}."
        )
    if shutdown_timeout is not None and not is_number(shutdown_timeout, 0, MAX_DELAY, above=True):
        raise ValueError(
            f"shutdown_timeout must be a positive number of seconds, at most {MAX_DELAY:g}, "
            f"not {shutdown_timeout!r}."
        )
    if worker_id is not None and not 0 < len(worker_id) <= MAX_WORKER_ID_LENGTH:
        raise ValueError(f"worker_id must be 1 to {MAX_WORKER_ID_LENGTH} characters long.")


def check_database(database: str) -> None:
    """Check the server version and the task table on this thread's connection to
    ``database``; raise ``RuntimeError`` saying what is wrong."""
    # Connected first: Django reads PostgreSQL's version on a connection of its own, opened and
    # closed for that, when the thread has none yet (one more connection at every start).
    connections[database].ensure_connection()
    message = unsupported_version(database)
    if message:
        raise RuntimeError(message)
    try:
        TaskRecord.objects.using(database).exists()
    except DatabaseError as e:
        raise RuntimeError(
            f"Cannot read the task table on database {database!r} ({e}); run "
            "'manage.py migrate django_sqltasks' first."
        ) from e
