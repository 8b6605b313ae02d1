"""A Django connection that a lost session left broken, in a thread that outlives requests.

Django drops a broken connection at a request's start and end (``close_old_connections``);
``sync_to_async``'s thread outside a request (a script's ``asyncio.run``, a task calling
``aenqueue``) has no such boundary, so the connection a restart, a failover or an idle
timeout killed would fail every later call on that thread. The paths that hop to that thread
drop it first, as Django would at a request's start.
"""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper


def drop_if_broken(connection: BaseDatabaseWrapper) -> None:
    """Close ``connection`` if a call on it failed and it no longer answers, so that the next
    statement opens a new one; never inside a transaction (its statements would be lost)."""
    if connection.connection is None or not connection.errors_occurred:
        return
    if connection.in_atomic_block or not connection.get_autocommit():
        return
    if connection.is_usable():
        connection.errors_occurred = False
        return
    drop(connection)


def drop(connection: BaseDatabaseWrapper) -> None:
    """Forget ``connection`` (broken), so that the next statement opens a new one."""
    try:
        connection.close()
    except Exception:  # broken already: forgetting it is all that is left
        connection.connection = None
