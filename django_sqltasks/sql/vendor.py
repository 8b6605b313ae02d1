"""What one database is: the facts the package acts on and the database's clock, on top of the
values that cross to it (``values.py``). Every statement builds on these."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import InterfaceError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.utils import timezone as dj_timezone

from .rows import TableHealth
from .values import Values


class Vendor(Values):
    """One database vendor's facts, clock and values, on one Django connection (shared by every
    thread: ``_current_connection`` gives the calling thread's)."""

    def __init__(
        self, connection: BaseDatabaseWrapper, *, tasks: str, workers: str, paused: str
    ) -> None:
        self.connection = connection
        qn = connection.ops.quote_name
        # The quoted names of the task, worker and paused-queue tables.
        self.tasks = qn(tasks)
        self.workers = qn(workers)
        self.paused = qn(paused)
        self.use_tz = settings.USE_TZ
        self._claim_clock = (None, None)

    # Facts ------------------------------------------------------------------------------

    product = "database"
    # How a worker learns of new tasks: "notify" (LISTEN/NOTIFY), "files" (watching the
    # database's files), or "poll" (only its claims).
    wakeup = "poll"
    # Whether the database takes one writer at a time (then a worker writes its outcomes on
    # the connection it claims with, instead of a second one that would wait for the first).
    single_writer = False
    # Whether the planner's row estimate is cheap to read (the admin uses it for large counts).
    estimates_counts = False
    # Whether the task table may be partitioned (by status, and finished tasks by day).
    partitions_tasks = False
    # Whether an index finds a value inside the JSON columns (a task's arguments, its tags),
    # so that the admin's search and filters look them up instead of reading a window.
    indexes_json_values = False
    # Whether the database orders task ids as Python orders their uuid.UUID values (MariaDB's
    # UUID type orders by another byte order).
    orders_uuids_as_python = True
    # How an operator ends another session, and the setting that ends a forgotten
    # transaction by itself (named in the warning of an old transaction).
    end_session = "KILL"
    idle_transaction_timeout = "idle_transaction_timeout (MariaDB)"
    # Whether aenqueue() talks to the database natively from the event loop (psycopg 3's
    # async connections), rather than through a thread.
    async_driver = False
    # Whether the main claim reads each priority from past what it already took, with a full
    # pass from the start now and then (sql/marks.py): a worker counts its full passes apart.
    claims_from_marks = False

    def planned_rows(self, cursor: CursorWrapper, sql: str, params: Sequence[Any]) -> int | None:
        """The rows the planner expects ``sql`` to return: a count that costs no scan, for a
        question asked of millions of rows ("about 1,200,000 tasks match"). None where the
        database makes no estimate (SQLite)."""
        return None

    def is_transient(self, error: BaseException) -> bool:
        """Whether ``error`` may go away by itself (a lost connection, a server restart, a
        deadlock, a lock timeout), so that the same statement may succeed if run again.
        Anything else (a value the database refuses, a statement it cannot run) is not."""
        return isinstance(error, InterfaceError)

    @staticmethod
    def names_missing_table(error: BaseException) -> bool:
        """Whether ``error`` (Django's or the driver's) says a table or column does not exist:
        what a missing migration looks like on this database."""
        return False

    def is_contention(self, error: BaseException) -> bool:
        """Whether ``error`` is a transient error caused by other transactions (a lock wait
        timeout, a deadlock, a serialization failure, a busy database file): never the fault
        of the statement that met it, so it is waited out, not judged."""
        return False

    def version_problem(self) -> str | None:
        """Say which version is needed if the server is too old for django-sqltasks."""
        return None

    def location(self) -> str:
        """Where the database is, for people: its host and port."""
        settings_dict = self.connection.settings_dict
        host = settings_dict.get("HOST") or "localhost"
        return f"{host}:{settings_dict['PORT']}" if settings_dict.get("PORT") else host

    def max_statement_bytes(self) -> int | None:
        """The largest statement the server accepts, in bytes, if it has a limit to heed."""
        return None

    def _current_connection(self) -> BaseDatabaseWrapper:
        """This dialect's connection for the calling thread (a dialect is shared by all)."""
        return connections[self.connection.alias]

    def _atomic(self) -> AbstractContextManager[Any]:
        """The transaction (or, inside one, the savepoint) that a statement's parts share."""
        return transaction.atomic(using=self.connection.alias)

    def write_transaction(self) -> AbstractContextManager[Any]:
        """A transaction that reads, then writes: where the database lets a writer in only
        after the transaction's reads (SQLite), it takes the write lock at its start."""
        return transaction.atomic(using=self.connection.alias)

    def announce_finished(self, cursor: CursorWrapper, task_ids: Sequence[uuid.UUID]) -> None:
        """Tell the processes waiting on ``task_ids`` (``result.wait()``) that they finished,
        where the database can (every statement that finishes a task calls it, or does as it
        does); elsewhere their waiters poll."""

    def session_statements(self) -> list[tuple[str, list[Any]]]:
        """Statements to run on a new connection of our own that Django would run on its own
        (none, on most databases)."""
        return []

    def worker_session_statements(self) -> list[tuple[str, list[Any]]]:
        """Statements to run on each connection that runs only the worker's own statements
        (its claims, outcome writes and upkeep; never a task's): where a statement's plan,
        made once, could suit only the table's size when it was made."""
        return []

    def table_health(self, cursor: CursorWrapper) -> TableHealth:
        """Read whether old row versions of the task table can be cleaned up, and what holds
        them back: autovacuum, dead rows, old transactions of other sessions."""
        return TableHealth()

    # Statements any part uses ------------------------------------------------------------

    _explain_prefix = "EXPLAIN"  # how to ask the planner for a statement's plan

    def explain(self, cursor: CursorWrapper, sql: str, params: Sequence[Any]) -> str:
        """The planner's plan for ``sql`` as text (the statement is not run)."""
        cursor.execute(f"{self._explain_prefix} {sql}", params)
        return "\n".join(" ".join(str(value) for value in row) for row in cursor.fetchall())

    def ping(self, cursor: CursorWrapper) -> None:
        """Run the cheapest statement: whether the database answers at all."""
        cursor.execute("SELECT 1")
        cursor.fetchone()

    _json_placeholder = "%s"

    _db_clock: str | None = None  # SQL for the database's current time; None: this process's

    # SQL for the database's time at the start of a statement: what an enqueue without
    # run_after is due at, and what a retry's or a snooze's delay counts from. None: this
    # process's (then _db_clock is None too).
    _write_clock: str | None = None

    def _now_sql(self) -> tuple[str, list[Any]]:
        """SQL (and its parameters) for the current time, by the database's clock."""
        if self._db_clock is not None:
            return self._db_clock, []
        return "%s", [self._encode_datetime(dj_timezone.now())]

    def _ago_sql(self, seconds: float) -> tuple[str, list[Any]]:
        """SQL (and its parameters) for the time ``seconds`` ago, by the database's clock."""
        return "%s", [self._encode_datetime(dj_timezone.now() - timedelta(seconds=seconds))]

    def db_now(self, cursor: CursorWrapper) -> datetime:
        """The database's current time (an aware datetime with USE_TZ, as Django reads it)."""
        sql, params = self._now_sql()
        if self._db_clock is None:
            return dj_timezone.now()
        cursor.execute(f"SELECT {sql}", params)
        value = self._decode_datetime(cursor.fetchone()[0])
        assert value is not None
        return value

    def _too_old(self, version: Sequence[int], needed: Sequence[int]) -> str:
        have = ".".join(map(str, version[: len(needed) + 1]))
        need = ".".join(map(str, needed))
        return (
            f"Database {self.connection.alias!r} runs {self.product} {have}; django-sqltasks "
            f"needs {self.product} {need} or newer."
        )
