"""A durable task's connection lost at one statement of its own, put on the task's thread with
Django's ``execute_wrapper``. The server ends the session (its own kill statement), so the
client meets the database's own error: just before the statement runs ("before"); just after
the statement has committed ("after": the write is in, but its client never heard); or just
after the statement ran in a transaction whose commit then never reaches the server
("uncommitted": the client had seen the statement succeed). Or the statement is held at a gate
("paused") while the test restarts the server."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_sqltasks.models import EventRecord, StepRecord, TaskRecord, WorkflowRecord
from tests import events

# The statement of each durable stage that the fault meets: (its verb, its table), or those
# it may begin with.
STATEMENTS: dict[str, tuple[tuple[str, str], ...]] = {
    "step": (("INSERT", StepRecord._meta.db_table),),  # a step's record
    "park": (("UPDATE", TaskRecord._meta.db_table),),  # a sleep's park
    # A wait meeting its event's row: PostgreSQL's first wait parks in one statement, which
    # begins there (sql/postgresql.py's park_at_event); the general way's UPDATE elsewhere.
    "event": (("UPDATE", EventRecord._meta.db_table), ("WITH", EventRecord._meta.db_table)),
    "group": (("UPDATE", WorkflowRecord._meta.db_table),),  # the group add's workflow lock
}
# The statement "uncommitted" meets instead, at every stage: a step's record written inside the
# stage's transaction (a wait's, a group add's), which the task's thread then remembers.
RECORD = (("INSERT", StepRecord._meta.db_table),)
END_SESSION = {
    "postgresql": "SELECT pg_terminate_backend(pg_backend_pid())",
    "mysql": "KILL CONNECTION CONNECTION_ID()",
}


def end_session(connection: BaseDatabaseWrapper) -> None:
    """End ``connection``'s session on the server; raise the error its client then meets."""
    with connection.wrap_database_errors:
        cursor = connection.connection.cursor()
        cursor.execute(END_SESSION[connection.vendor])
        cursor.execute("SELECT 1")  # where the kill itself answered
    raise AssertionError("the session outlived its end")


def _meets(sql: str, statements: tuple[tuple[str, str], ...]) -> bool:
    return any(
        sql.lstrip().upper().startswith(verb) and table in sql.split("SET")[0]
        for verb, table in statements
    )


@contextlib.contextmanager
def lost_at(
    stage: str, when: str, *, gate: str = "", then: Callable[[], Any] | None = None
) -> Iterator[None]:
    """Lose this thread's connection at the first statement of ``stage`` (see STATEMENTS) in
    the block (RECORD for "uncommitted"), ``when`` "before", "after", "uncommitted" or "paused"
    (at ``gate``, noting "paused"). After a commit, ``then`` runs first, on the connection still
    open (what another session might do in the meantime: claim the task again, send its
    event)."""
    connection = connections["default"]
    statement = RECORD if when == "uncommitted" else STATEMENTS[stage]
    met = False
    release = ""  # "uncommitted": the release of the savepoint the statement ran in

    def after() -> None:
        if then is not None:
            then()
        end_session(connection)

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal met, release
        if release and sql == release:
            result = execute(sql, params, many, context)
            release = ""
            with contextlib.suppress(DatabaseError):
                end_session(connection)
            return result
        if met or not _meets(sql, statement):
            return execute(sql, params, many, context)
        met = True
        if when == "before":
            with contextlib.suppress(DatabaseError):
                end_session(connection)
        elif when == "paused":
            events.note("paused", stage=stage)
            events.wait_at(gate)
        result = execute(sql, params, many, context)
        if when == "uncommitted":
            assert connection.in_atomic_block, "a statement that commits as it runs"
            if connection.savepoint_ids:
                release = connection.ops.savepoint_commit_sql(connection.savepoint_ids[-1])
            else:
                with contextlib.suppress(DatabaseError):
                    end_session(connection)
        if when == "after":
            if connection.in_atomic_block:
                transaction.on_commit(after, using=connection.alias)
            else:
                after()
        return result

    with connection.execute_wrapper(wrapper):
        yield


# Lock timeouts short enough for a test to see a retry (a connection_created hook sets them).
SHORT_LOCK_TIMEOUT = {
    "postgresql": "SET lock_timeout = '100ms'",
    "mysql": "SET SESSION lock_wait_timeout = 1, innodb_lock_wait_timeout = 1",
    "sqlite": "PRAGMA busy_timeout = 100",
}


class Retried(logging.Handler):
    """Set ``event`` when the worker logs a retry of a database call (``action=db_retry``)."""

    def __init__(self) -> None:
        super().__init__()
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "action", None) == "db_retry":
            self.event.set()
