"""SQLite: one UPDATE ... RETURNING claims a batch; SQLite's single writer makes it atomic."""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from django.db import DatabaseError, OperationalError, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from . import health, probes
from .claims import claims_commit_relaxed
from .dialect import Dialect
from .rows import (
    OUTCOME_COLUMNS,
    RETURNED_COLUMNS,
    ClaimedRow,
    Outcome,
    TableHealth,
)

RETURNING = ", ".join(RETURNED_COLUMNS)
# What a claim writes on each row it takes; parameters: the worker's id twice, then the
# claim's time twice.
CLAIM_SET = """status = 'RUNNING', owner = %s, attempts = attempts + 1,
    worker_ids = json_insert(worker_ids, '$[#]', %s),
    started_at = COALESCE(started_at, %s), last_attempted_at = %s"""
MIN_VERSION = (3, 35)  # UPDATE ... RETURNING, used by the claim
# The statement that tells whether another connection has committed since it last ran.
DATA_VERSION_SQL = "PRAGMA data_version"
# PRAGMA synchronous: a commit in WAL mode waits for its fsync at FULL (2, the default) and
# EXTRA (3), not at NORMAL (1) or OFF (0). A PRAGMA takes no parameter: one fixed text a level.
SYNCHRONOUS_NORMAL = 1
SET_SYNCHRONOUS = (
    "PRAGMA synchronous = 0",
    "PRAGMA synchronous = 1",
    "PRAGMA synchronous = 2",
    "PRAGMA synchronous = 3",
)
MISSING_MESSAGES = ("no such table", "no such column", "has no column named")


class SQLiteDialect(probes.SQLiteProbe, Dialect):
    product = "SQLite"
    wakeup = "files"
    single_writer = True
    _explain_prefix = "EXPLAIN QUERY PLAN"

    @contextlib.contextmanager
    def write_transaction(self) -> Iterator[None]:
        # A deferred transaction that has read cannot take the write lock once another
        # connection has written since: SQLite fails it at once ("database is locked"), busy
        # timeout or not. BEGIN IMMEDIATE takes the lock first, waiting up to the timeout.
        connection = self._current_connection()
        if connection.in_atomic_block:  # a savepoint: the outer transaction began already
            with transaction.atomic(using=connection.alias):
                yield
            return
        connection.ensure_connection()  # connecting sets transaction_mode from the settings
        mode = connection.transaction_mode  # type: ignore[attr-defined]
        immediate = "EXCLUSIVE" if mode == "EXCLUSIVE" else "IMMEDIATE"
        connection.transaction_mode = immediate  # type: ignore[attr-defined]
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(transaction.atomic(using=connection.alias))  # BEGIN here
            finally:
                connection.transaction_mode = mode  # type: ignore[attr-defined]
            yield

    def table_health(self, cursor: CursorWrapper) -> TableHealth:
        # A checkpoint cannot run inside a transaction of its own connection ("database table
        # is locked"): inside one (a caller's atomic block), nothing is read.
        if self._current_connection().in_atomic_block:
            return TableHealth()
        return health.read_sqlite(cursor)

    def is_transient(self, error: BaseException) -> bool:
        # Another connection holds the write lock past the busy timeout: "database is
        # locked" (or a table of it). Other OperationalErrors (no such table, too big) stay.
        return isinstance(error, OperationalError) and "locked" in str(error)

    def location(self) -> str:
        return str(self.connection.settings_dict.get("NAME"))  # a file

    @staticmethod
    def names_missing_table(error: BaseException) -> bool:
        if not isinstance(error, DatabaseError | sqlite3.DatabaseError):
            return False  # a task's own ValueError("no such table ...") says nothing of ours
        message = str(error)
        return message.startswith(MISSING_MESSAGES[:2]) or MISSING_MESSAGES[2] in message

    def is_contention(self, error: BaseException) -> bool:
        return self.is_transient(error)

    def version_problem(self) -> str | None:
        version = self.connection.Database.sqlite_version_info  # type: ignore[attr-defined]
        return self._too_old(version, MIN_VERSION) if version < MIN_VERSION else None

    def _append_error(self, column: str, class_sql: str, traceback_sql: str) -> str:
        return (
            f"json_insert({column}, '$[#]', json_object("
            f"'exception_class_path', {class_sql}, 'traceback', {traceback_sql}))"
        )

    # A claim takes the due tasks of one priority a statement, highest first (the walk in
    # ClaimStatements.claim). One statement cannot do this here: SQLite has no LATERAL, reads
    # "priority IN (...)" with a SeekScan step that in 3.40 returned tasks not yet due, and
    # builds a Bloom filter of every task of the backend for a join.
    _priorities_a_statement = 1

    @contextlib.contextmanager
    def _claim_transaction(self, backend_name: str) -> Iterator[None]:
        """The claim's statements commit at ``synchronous=NORMAL`` where the backend's
        CLAIM_SYNCHRONOUS_COMMIT is False (the default): in WAL mode such a commit does not wait
        for its fsync. A crash of the process loses nothing (the commit is in the file); a crash
        of the machine may lose the claims since the last commit that waited, any connection's
        (the WAL is one file, written in order), and their tasks are READY again. The
        connection's own level is back for its next statement. Inside a transaction (a test's,
        a caller's atomic block) SQLite cannot change the level, and the claim keeps it."""
        if not claims_commit_relaxed(backend_name):
            yield
            return
        connection = self._current_connection()
        if connection.in_atomic_block or not connection.get_autocommit():
            yield
            return
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA synchronous")
            level = int(cursor.fetchone()[0])
            if not SYNCHRONOUS_NORMAL < level < len(SET_SYNCHRONOUS):  # already relaxed
                yield
                return
            cursor.execute(SET_SYNCHRONOUS[SYNCHRONOUS_NORMAL])
            try:
                yield
            finally:
                try:
                    cursor.execute(SET_SYNCHRONOUS[level])
                except Exception:
                    # Never leave this connection's enqueues and outcomes relaxed: a new
                    # connection starts at the project's level.
                    connection.close()
                    raise

    def _claim_step_sql(
        self,
        ready: tuple[str, list[Any]],
        worker_id: str,
        limit: int,
        priorities: Sequence[int] | None,
        index: str | None = None,
    ) -> tuple[str, list[Any]]:
        where, where_params = ready
        at = self._encode_datetime(timezone.now())  # one machine: its clock is the database's
        order = "priority DESC, available_at"
        if priorities is not None:
            (priority,) = priorities
            where, where_params = f"{where} AND priority = %s", [*where_params, priority]
            order = "available_at"
        return (
            f"""
            UPDATE {self.tasks}
            SET {CLAIM_SET}
            WHERE id IN (
                SELECT id FROM {self.tasks}
                WHERE {where} AND available_at <= %s
                ORDER BY {order}
                LIMIT %s
            )
            RETURNING {RETURNING}
            """,
            [worker_id, worker_id, at, at, *where_params, at, limit],
        )

    def claim_suspect_by_id(
        self, cursor: CursorWrapper, task_id: uuid.UUID, worker_id: str
    ) -> ClaimedRow | None:
        at = self._encode_datetime(timezone.now())  # one machine: its clock is the database's
        cursor.execute(
            f"""
            UPDATE {self.tasks}
            SET {CLAIM_SET}
            WHERE id = %s AND status = 'READY' AND available_at IN (%s, %s, %s)
            RETURNING {RETURNING}
            """,
            [worker_id, worker_id, at, at, self._encode_id(task_id), *self._suspect_marks()],
        )
        rows = self._fetch_claimed(cursor)
        return rows[0] if rows else None

    def complete(
        self, cursor: CursorWrapper, worker_id: str, outcomes: Sequence[Outcome]
    ) -> set[uuid.UUID]:
        marks = ", ".join(["%s"] * len(OUTCOME_COLUMNS))
        rows = ", ".join([f"({marks})"] * len(outcomes))
        params = [value for o in outcomes for value in self._outcome_params(o)]
        error = self._append_error(f"{self.tasks}.errors", "v.error_class", "v.error_traceback")
        # The owner guard keeps a late result from overwriting a task that was rescued and
        # claimed again (or finished) meanwhile; the attempt guard, one claimed again by
        # another process under the same worker id.
        cursor.execute(
            f"""
            WITH v({", ".join(OUTCOME_COLUMNS)}) AS (VALUES {rows})
            UPDATE {self.tasks}
            SET status = v.status, finished_at = v.finished_at, owner = NULL,
                return_value = v.return_value,
                errors = CASE WHEN v.error_class IS NULL THEN {self.tasks}.errors
                              ELSE {error} END,
                available_at = COALESCE(v.available_at, {self.tasks}.available_at),
                attempts = {self.tasks}.attempts - v.snoozed,
                snoozes = {self.tasks}.snoozes + v.snoozed
            FROM v
            WHERE {self.tasks}.id = v.id AND {self.tasks}.status = 'RUNNING'
                AND {self.tasks}.owner = %s
                AND (v.attempt IS NULL OR {self.tasks}.attempts = v.attempt)
            RETURNING {self.tasks}.id
            """,
            [*params, worker_id],
        )
        return {self._decode_id(values[0]) for values in cursor.fetchall()}
