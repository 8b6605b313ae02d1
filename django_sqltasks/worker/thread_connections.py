"""The database connections of the worker's task and receiver threads: when a thread keeps the
connection its last task used, and when it closes it (``worker/threads.py`` calls these)."""

from __future__ import annotations

import select
import threading
from typing import Any

from django.db import close_old_connections, connections
from django.db.backends.signals import connection_created

from ..sql.broken import drop

# Whether the current thread has opened a database connection: a thread that never did has
# nothing to close after a task, and asking Django costs more than a fast task.
_opened = threading.local()


def _mark_opened(sender: Any, **kwargs: Any) -> None:
    _opened.connection = True


connection_created.connect(_mark_opened, dispatch_uid="django_sqltasks.thread_connections")


def close_used_connections() -> None:
    """``close_old_connections()``, on a thread that has opened a connection."""
    if getattr(_opened, "connection", False):
        close_old_connections()


def release_used_connections() -> bool:
    """After a task: ``close_old_connections()``, but keep a healthy connection that only
    ``CONN_MAX_AGE = 0`` would close (not one of Django's pool, whose close hands it back for
    any thread to take), for the thread's next task to reuse; return whether one is kept. The
    thread closes it with ``close_used_connections()`` once it has waited ``IDLE_CLOSE`` with
    no task: it holds no more connections at once than when it closed one after each task,
    but a stream of tasks that use the ORM (a durable task's steps do) opens one connection a
    thread, not one a task. A connection left out of autocommit (a transaction open), or one
    that failed and no longer answers, is closed as before: no task inherits a transaction; a
    kept one the server ends meanwhile is closed before the next task starts
    (``drop_ended_connections``)."""
    if not getattr(_opened, "connection", False):
        return False
    kept = False
    for connection in connections.all(initialized_only=True):
        if connection.connection is None or not _closed_only_for_age(connection):
            connection.close_if_unusable_or_obsolete()
            continue
        close_at, connection.close_at = connection.close_at, None
        try:
            connection.close_if_unusable_or_obsolete()  # every rule but the age
        finally:
            if connection.connection is not None:
                connection.close_at = close_at
                kept = True
    return kept


def drop_ended_connections() -> None:
    """Before a task, on a thread whose last task kept its connection: close each that the
    server ended meanwhile (an idle timeout, a restart, a failover), so that the task's first
    query opens a new one instead of failing. A session the server ended has sent its last
    message, so its socket reads as ready: one ``select()``, no round trip (an idle session
    has nothing to read). A driver that does not give its socket (mysqlclient) gets Django's
    health check instead: a ping before the task's first query."""
    for connection in connections.all(initialized_only=True):
        raw = connection.connection
        if raw is None:
            continue
        fileno = getattr(raw, "fileno", None)
        if fileno is None:
            # A new connection reads the setting again (BaseDatabaseWrapper.connect()).
            connection.health_check_enabled = True  # type: ignore[attr-defined]
            continue
        try:
            ended = bool(select.select([fileno()], [], [], 0)[0])
        except Exception:  # closed already, or no socket to watch: open a new one
            ended = True
        if ended:
            drop(connection)


def _closed_only_for_age(connection: Any) -> bool:
    """Whether Django would close ``connection`` after each request only because its
    ``CONN_MAX_AGE`` is 0 (Django's pool aside)."""
    settings = connection.settings_dict
    return settings.get("CONN_MAX_AGE", 0) == 0 and not settings.get("OPTIONS", {}).get("pool")
