"""What one database is, and how values and times cross to it: the facts the package acts on,
the database's clock, and values in and out (ids, datetimes, a claimed row). Every statement
builds on these."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import orjson
from django.conf import settings
from django.db import InterfaceError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.utils import timezone as dj_timezone

from ..ids import set_uuid_int, set_uuid_safe
from .rows import RETURNED_COLUMNS, UTC, ClaimedRow, TableHealth, json_column

json_loads = orjson.loads
_new_object = object.__new__
_UNKNOWN_SAFETY = uuid.SafeUUID.unknown
_from_iso = datetime.fromisoformat


def uuid_from_text(text: str) -> uuid.UUID:
    """``uuid.UUID(text)`` for the database's text form of an id, in half the time: the
    checks of ``UUID.__init__`` but the one that matters here, 32 hex digits."""
    digits = text.replace("-", "")
    if len(digits) != 32:
        return uuid.UUID(text)
    value = _new_object(uuid.UUID)
    set_uuid_int(value, int(digits, 16))
    set_uuid_safe(value, _UNKNOWN_SAFETY)
    return value


def _text_id(value: Any) -> str:
    """A claimed id's text where it is the canonical form (PostgreSQL's uuid as text, 36
    characters), else "" (SQLite's and MySQL's are 32 hex digits)."""
    return value if type(value) is str and len(value) == 36 else ""


class Vendor:
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
        # The text of the last claimed row's started_at and its decoded value.
        self._claim_clock: tuple[Any, datetime | None] = (None, None)

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

    # Values in and out ------------------------------------------------------------------

    def _encode_id(self, value: uuid.UUID) -> Any:
        return value.hex

    def _decode_id(self, value: Any) -> uuid.UUID:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(value)

    def _encode_datetime(self, value: datetime | None) -> Any:
        return self.connection.ops.adapt_datetimefield_value(value)

    def _decode_datetime(self, value: Any) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC) if self.use_tz else value
        # Text from the database is in the connection's time zone, which without USE_TZ is
        # TIME_ZONE: the naive local time Django would return.
        return value if self.use_tz else value.replace(tzinfo=None)

    def _claimed_row(self, values: Sequence[Any], *, json_decoded: bool = False) -> ClaimedRow:
        """A claimed row from its RETURNED_COLUMNS values; ``json_decoded`` when the JSON
        columns arrive as Python values rather than text."""
        if not json_decoded:
            # One pass for a sound row (each column decoded inline, no check recorded); any
            # row it does not take whole is decoded again column by column, which says why.
            try:
                row = self._sound_claimed_row(values)
            except (ValueError, TypeError, RecursionError, AttributeError):
                row = None
            if row is not None:
                return row
        return self._checked_claimed_row(values, json_decoded=json_decoded)

    def _sound_claimed_row(self, values: Sequence[Any]) -> ClaimedRow | None:
        """A claimed row from text JSON columns, if every column holds what it should; None
        (or an exception) if not."""
        (
            id_,
            _task_path,  # these four pass through as they came (values[1:5])
            _backend_name,
            _queue_name,
            _priority,
            args,
            kwargs,
            enqueued_at,
            run_after,
            started_at,
            last_attempted_at,
            errors,
            worker_ids,
            attempts,
            snoozes,
            workflow_id,
            trace_parent,
        ) = values  # fmt: skip  (RETURNED_COLUMNS, in order)
        # Empty ones (most) without the decoder: a fresh list or dict each, as it would give.
        args = [] if args == "[]" else json_loads(args)
        kwargs = {} if kwargs == "{}" else json_loads(kwargs)
        errors = [] if errors == "[]" else json_loads(errors)
        worker_ids = json_loads(worker_ids)
        if (
            type(args) is not list
            or type(kwargs) is not dict
            or type(errors) is not list
            or type(worker_ids) is not list
        ):
            return None
        decode = self._decode_datetime
        enqueued: datetime | None
        if type(enqueued_at) is str and self.use_tz:
            # The common case inline (a claim decodes one per row): aware text, kept aware.
            enqueued = _from_iso(enqueued_at)
            if enqueued.tzinfo is None:
                enqueued = enqueued.replace(tzinfo=UTC)
        else:
            enqueued = decode(enqueued_at)
        # The rows of one claim share its clock, and a first attempt's two times are one:
        # decode each text once (a tuple, replaced whole: threads may share this dialect).
        memo_text, memo_value = self._claim_clock
        if started_at == memo_text:
            started = memo_value
        else:
            started = decode(started_at)
            self._claim_clock = (started_at, started)
        attempted = started if last_attempted_at == started_at else decode(last_attempted_at)
        if enqueued is None or started is None or attempted is None:
            return None
        if type(id_) is str:
            task_id = uuid_from_text(id_)
            text_id = id_ if len(id_) == 36 else ""  # as _text_id, without its call
        else:
            task_id, text_id = (id_ if type(id_) is uuid.UUID else uuid_from_text(id_)), ""
        # Positional, in ClaimedRow's field order: its 18 keywords cost a row about 0.2 us.
        return ClaimedRow(
            task_id,
            values[1],  # task_path, backend_name, queue_name and priority, as they came
            values[2],
            values[3],
            values[4],
            args,
            kwargs,
            enqueued,
            None if run_after is None else decode(run_after),
            started,
            attempted,
            errors,
            worker_ids,
            attempts,
            snoozes,
            None if workflow_id is None else self._decode_id(workflow_id),
            None,  # corrupt
            trace_parent,
            text_id,
        )

    def _checked_claimed_row(
        self, values: Sequence[Any], *, json_decoded: bool = False
    ) -> ClaimedRow:
        """A claimed row decoded column by column: a column that does not hold what it should
        is recorded in ``corrupt``, so that the row fails alone and says why."""
        v = dict(zip(RETURNED_COLUMNS, values, strict=True))
        # A row damaged outside this package must fail alone, not break the whole claim.
        problems: list[str] = []
        decode_json = partial(json_column, decoded=json_decoded, problems=problems)
        decode = partial(self._decode_claimed_datetime, problems=problems)
        workflow_id = v["workflow_id"]
        return ClaimedRow(
            id=self._decode_id(v["id"]),
            task_path=v["task_path"],
            backend_name=v["backend_name"],
            queue_name=v["queue_name"],
            priority=v["priority"],
            args=decode_json("args", v["args"]),
            kwargs=decode_json("kwargs", v["kwargs"]),
            enqueued_at=decode(v["enqueued_at"]),  # type: ignore[arg-type]
            run_after=decode(v["run_after"]),
            started_at=decode(v["started_at"]),  # type: ignore[arg-type]
            last_attempted_at=decode(v["last_attempted_at"]),  # type: ignore[arg-type]
            errors=decode_json("errors", v["errors"]),
            worker_ids=decode_json("worker_ids", v["worker_ids"]),
            attempts=v["attempts"],
            snoozes=v["snoozes"],
            workflow_id=None if workflow_id is None else self._decode_id(workflow_id),
            corrupt="; ".join(problems) or None,
            trace_parent=v["trace_parent"],
            text_id=_text_id(v["id"]),
        )

    def _decode_claimed_datetime(self, value: Any, *, problems: list[str]) -> datetime | None:
        try:
            return self._decode_datetime(value)
        except (TypeError, ValueError) as e:
            problems.append(f"a date column holds {str(value)[:100]!r} ({e})")
            return datetime.now(UTC)
