"""MySQL 8 and MariaDB 10.6+: SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE, in one transaction.

Neither has UPDATE ... RETURNING, so the claim reads the rows it locks and computes what the
UPDATE writes, instead of reading them back.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from django.db import IntegrityError, InterfaceError
from django.db.backends.utils import CursorWrapper

from . import health, probes
from .dialect import Dialect
from .rows import (
    CORRUPT_TASK,
    OUTCOME_COLUMNS,
    RETURNED_COLUMNS,
    UNLIMITED,
    ClaimedRow,
    NewTask,
    Outcome,
    Scope,
    TableHealth,
)
from .vendor import driver_error

COLUMNS = ", ".join(RETURNED_COLUMNS)
MIN_MARIADB = (10, 6)  # SKIP LOCKED
MIN_MYSQL = (8, 0)  # SKIP LOCKED
# Error codes that may go away by themselves: too many connections (1040), server shutdown
# (1053), lock wait timeout (1205), deadlock (1213), connection killed (1927), cannot connect
# (2002, 2003), server gone away (2006), lost connection (2013, 2055), disconnected for
# inactivity (4031). A packet over max_allowed_packet (1153) is not one of them: it fails the
# same way every time.
MISSING_CODES = frozenset({1146, 1054})  # ER_NO_SUCH_TABLE, ER_BAD_FIELD_ERROR
CONTENTION_CODES = frozenset({1205, 1213})
TRANSIENT_CODES = CONTENTION_CODES | {1040, 1053, 1927, 2002, 2003, 2006, 2013, 2055, 4031}
STATEMENT_OVERHEAD = 64 * 1024  # bytes of an outcome's statement besides its two large values
# Priorities one claim SELECT reads ("priority IN (...)"). MariaDB estimates an IN list of more
# than eq_range_index_dive_limit (200) values from statistics, and then read the backend's whole
# index range (deferred tasks included) instead of one range per priority.
PRIORITIES_A_SELECT = 20


# The attribute that caches the server's max_allowed_packet on a DB-API connection object, so
# a new connection (after a reconnect, or CONN_MAX_AGE) reads it again.
PACKET_CACHE_ATTRIBUTE = "_sqltasks_max_allowed_packet"
# Asked of the server once per connection; a read of a variable, not a query of the tables.
MAX_ALLOWED_PACKET_SQL = "SELECT @@max_allowed_packet"


class MySQLDialect(probes.MySQLProbe, Dialect):
    product = "MySQL"
    orders_uuids_as_python = False  # MariaDB's UUID type

    def __init__(self, connection: Any) -> None:
        super().__init__(connection)
        # Django stores naive UTC with USE_TZ; without it, naive local time, which only this
        # process's clock knows.
        if self.use_tz:
            self._db_clock = self._write_clock = "UTC_TIMESTAMP(6)"  # the statement's start

    def _ago_sql(self, seconds: float) -> tuple[str, list[Any]]:
        if self._db_clock is None:
            return super()._ago_sql(seconds)
        return f"{self._db_clock} - INTERVAL %s MICROSECOND", [round(seconds * 1_000_000)]

    def planned_rows(self, cursor: CursorWrapper, sql: str, params: Sequence[Any]) -> int | None:
        cursor.execute(f"EXPLAIN {sql}", params)
        names = [column[0] for column in cursor.description]
        row = dict(zip(names, cursor.fetchone(), strict=True))
        rows = float(row.get("rows") or 0)
        # MariaDB's "filtered" is the share of those rows the rest of the WHERE keeps.
        return round(rows * float(row.get("filtered") or 100) / 100)

    def is_transient(self, error: BaseException) -> bool:
        if isinstance(error, InterfaceError):
            return True
        args: tuple[Any, ...] = getattr(driver_error(error), "args", ())
        return bool(args) and args[0] in TRANSIENT_CODES

    @staticmethod
    def names_missing_table(error: BaseException) -> bool:
        cause = driver_error(error)
        args: tuple[Any, ...] = getattr(cause, "args", ())
        return (
            type(cause).__module__.startswith("MySQLdb")
            and bool(args)
            and (args[0] in MISSING_CODES)
        )

    def is_contention(self, error: BaseException) -> bool:
        args: tuple[Any, ...] = getattr(driver_error(error), "args", ())
        return bool(args) and args[0] in CONTENTION_CODES

    def version_problem(self) -> str | None:
        connection = self._current_connection()
        connection.ensure_connection()
        version = connection.mysql_version  # type: ignore[attr-defined]
        if connection.mysql_is_mariadb:  # type: ignore[attr-defined]
            self.product = "MariaDB"
            return self._too_old(version, MIN_MARIADB) if version < MIN_MARIADB else None
        return self._too_old(version, MIN_MYSQL) if version < MIN_MYSQL else None

    def max_statement_bytes(self) -> int:
        """The server's ``max_allowed_packet`` (read once per connection): a larger statement
        is not refused with an error, the server drops the connection (2006, 1153)."""
        connection = self._current_connection()
        connection.ensure_connection()
        raw = connection.connection
        cached: int | None = getattr(raw, PACKET_CACHE_ATTRIBUTE, None)
        if cached is None:
            with connection.cursor() as cursor:
                cursor.execute(MAX_ALLOWED_PACKET_SQL)
                cached = int(cursor.fetchone()[0])
            # A driver object that takes no attributes is asked each time instead.
            with contextlib.suppress(AttributeError):
                setattr(raw, PACKET_CACHE_ATTRIBUTE, cached)
        return cached

    def outcome_problem(self, outcome: Outcome) -> str | None:
        # A statement over max_allowed_packet makes the server drop the connection (error
        # 1153 or 2006): say so before sending it. Characters are at most 4 bytes in utf8mb4;
        # count bytes only when that bound is over the limit.
        values = [outcome.return_value or "", outcome.error_traceback or ""]
        limit = self.max_statement_bytes() - STATEMENT_OVERHEAD
        if sum(len(v) for v in values) * 4 <= limit:
            return None
        size = sum(len(v.encode("utf-8", "surrogatepass")) for v in values)
        if size <= limit:
            return None
        return (
            f"it is {size:,} bytes, over what one statement can carry on this server "
            f"(max_allowed_packet is {self.max_statement_bytes():,} bytes): raise "
            "max_allowed_packet, "
            "or set MAX_PAYLOAD_BYTES so that oversized return values fail when returned"
        )

    def table_health(self, cursor: CursorWrapper) -> TableHealth:
        return health.read_mysql(cursor)

    def _append_error(self, column: str, class_sql: str, traceback_sql: str) -> str:
        return (
            f"JSON_ARRAY_APPEND({column}, '$', JSON_OBJECT("
            f"'exception_class_path', {class_sql}, 'traceback', {traceback_sql}))"
        )

    def _concat(self, *parts: str) -> str:
        return f"CONCAT({', '.join(parts)})"

    def insert_deduplicated(self, cursor: CursorWrapper, task: NewTask, notify: bool) -> bool:
        # No ON CONFLICT DO NOTHING (INSERT IGNORE would hide other errors too): try, and
        # roll back to a savepoint on the one duplicate we expect.
        try:
            with self._atomic():
                self.insert(cursor, [task])
        except IntegrityError as e:
            if "sqltasks_dedupe_live" not in str(e):
                raise
            return False
        return True

    # A claim locks the due tasks of PRIORITIES_A_SELECT priorities a SELECT, highest first
    # (the walk in ClaimStatements.claim), then marks them RUNNING at once (_take).
    _priorities_a_statement = PRIORITIES_A_SELECT

    def _claim_transaction(self, backend_name: str) -> contextlib.AbstractContextManager[object]:
        # The selected rows stay locked until this transaction commits: keep it to the
        # claim's statements (one SELECT, unless the first PRIORITIES_A_SELECT priorities with
        # due tasks do not fill the batch, and the UPDATE).
        return self._atomic()

    def _claim_step_rows(self, cursor: CursorWrapper) -> list[Any]:
        return cursor.fetchall()

    def claim_suspect_by_id(
        self, cursor: CursorWrapper, task_id: uuid.UUID, worker_id: str
    ) -> ClaimedRow | None:
        now, now_params = self._now_sql()
        with self._atomic():
            cursor.execute(
                f"SELECT {COLUMNS}, {now} FROM {self.tasks} "
                "WHERE id = %s AND status = 'READY' AND available_at IN (%s, %s, %s) "
                "FOR UPDATE SKIP LOCKED",
                [*now_params, self._encode_id(task_id), *self._suspect_marks()],
            )
            rows = self._take(cursor, cursor.fetchall(), worker_id)
        return rows[0] if rows else None

    def _take(
        self, cursor: CursorWrapper, taken: Sequence[Any], worker_id: str
    ) -> list[ClaimedRow]:
        """Mark the rows of a locking SELECT RUNNING for ``worker_id`` (each row ends with the
        database's time of the SELECT: the claim's time); fail those that cannot be read."""
        if not taken:
            return []
        now = self._decode_datetime(taken[0][-1])
        assert now is not None
        at = self._encode_datetime(now)
        rows = [self._claimed_row(values[:-1]) for values in taken]
        corrupt = [r for r in rows if r.corrupt is not None]
        if corrupt:
            # MariaDB checks every JSON column's CHECK on any UPDATE of the row: a row
            # with text that is not JSON cannot even be claimed. Fail it here instead.
            self._fail_corrupt(cursor, corrupt, at)
            rows = [r for r in rows if r.corrupt is None]
        if not rows:
            return []
        marks = ", ".join(["%s"] * len(rows))
        cursor.execute(
            f"""
            UPDATE {self.tasks}
            SET status = 'RUNNING', owner = %s, attempts = attempts + 1,
                worker_ids = JSON_ARRAY_APPEND(worker_ids, '$', %s),
                started_at = COALESCE(started_at, %s), last_attempted_at = %s
            WHERE id IN ({marks})
            """,
            [worker_id, worker_id, at, at, *(self._encode_id(r.id) for r in rows)],
        )
        return [
            replace(
                r,
                attempts=r.attempts + 1,
                worker_ids=[*r.worker_ids, worker_id],
                started_at=r.started_at or now,
                last_attempted_at=now,
            )
            for r in rows
        ]

    def _fail_corrupt(self, cursor: CursorWrapper, rows: list[ClaimedRow], at: Any) -> None:
        """Mark rows FAILED whose JSON does not parse, keeping the bad text in the error."""
        for row in rows:
            # errors is set first: MySQL evaluates SET clauses left to right, and the
            # message must quote the columns before they are repaired.
            cursor.execute(
                f"""
                UPDATE {self.tasks}
                SET errors = JSON_ARRAY(JSON_OBJECT(
                        'exception_class_path', %s,
                        'traceback', CONCAT(%s,
                            IF(JSON_VALID(args), '', CONCAT(' args was: ', LEFT(args, 1000))),
                            IF(JSON_VALID(kwargs), '',
                               CONCAT(' kwargs was: ', LEFT(kwargs, 1000))))
                    )),
                    args = IF(JSON_VALID(args), args, '[]'),
                    kwargs = IF(JSON_VALID(kwargs), kwargs, '{{}}'),
                    worker_ids = IF(JSON_VALID(worker_ids), worker_ids, '[]'),
                    return_value = NULL, status = 'FAILED', finished_at = %s, owner = NULL
                WHERE id = %s AND status = 'READY'
                """,
                [
                    CORRUPT_TASK,
                    f"The stored task cannot be run: {row.corrupt}.",
                    at,
                    self._encode_id(row.id),
                ],
            )

    def _claim_step_sql(
        self,
        ready: tuple[str, list[Any]],
        worker_id: str,
        limit: int,
        priorities: Sequence[int] | None,
        index: str | None = None,
    ) -> tuple[str, list[Any]]:
        """The claim's locking SELECT; ``priorities`` (from ``_due_priorities_sql``) makes it
        read one index range of due tasks per priority instead of one range of them all, in
        which the deferred tasks of a higher priority come before the due ones of a lower.
        It names its ready index: MariaDB took the admin's (queue_name, id) index for a claim
        of one queue and read every task of the queue, finished ones too."""
        where, where_params = ready
        source = self.tasks if index is None else f"{self.tasks} FORCE INDEX ({index})"
        now, now_params = self._now_sql()
        if priorities is not None:
            marks = ", ".join(["%s"] * len(priorities))
            where += f" AND priority IN ({marks})"
            where_params = [*where_params, *priorities]
        return (
            f"""
            SELECT {COLUMNS}, {now} FROM {source}
            WHERE {where} AND available_at <= {now}
            ORDER BY priority DESC, available_at
            LIMIT %s
            FOR UPDATE SKIP LOCKED
            """,
            [*now_params, *where_params, *now_params, limit],
        )

    def _span_sql(
        self, backend_name: str, queue_names: list[str] | None, scope: Scope
    ) -> tuple[str, str, list[Any]]:
        """The walk over priorities of ``_due_priorities_sql`` and ``_oldest_ready_sql``: a
        recursive CTE ``span(p, low)`` holding each whole number from the highest priority of
        READY tasks to the lowest (two probes of the ready index, for those bounds), and the
        probe of the earliest task of priority ``span.p``; then their parameters. MariaDB plans
        a subquery that depends on the recursive CTE once, so "the next priority below p" would
        read every task of p; "the earliest task of priority p" it reads from the index at
        once. Each probe names its index: with statistics that trail the table, MariaDB took
        another ready index and sorted every READY task of the backend."""
        prefix, params = self._ready_prefix(backend_name, queue_names, scope)
        index = self._ready_index(queue_names, scope)
        source = self.tasks if index is None else f"{self.tasks} FORCE INDEX ({index})"
        probe = f"SELECT priority FROM {source} WHERE {prefix} ORDER BY priority"
        span = f"""span(p, low) AS (
                SELECT ({probe} DESC LIMIT 1), ({probe} LIMIT 1)
                UNION ALL
                SELECT p - 1, low FROM span WHERE p > low
            )"""
        earliest = (
            f"SELECT available_at FROM {source} WHERE {prefix} AND priority = span.p "
            "ORDER BY available_at LIMIT 1"
        )
        return span, earliest, [*params, *params, *params]

    def _due_priorities_sql(
        self, backend_name: str, queue_names: list[str] | None, scope: Scope = UNLIMITED
    ) -> tuple[str, list[Any]]:
        """The priorities that have a due READY task a claim may take: one probe of the ready
        index for each whole number between the highest and lowest priority of READY tasks (is
        its earliest task due?), as ``_span_sql`` says."""
        span, earliest, params = self._span_sql(backend_name, queue_names, scope)
        now, now_params = self._now_sql()
        return (
            f"""
            WITH RECURSIVE {span}
            SELECT p FROM span WHERE ({earliest}) <= {now}
            ORDER BY p DESC
            """,
            [*params, *now_params],
        )

    def _oldest_ready_sql(self, backend_name: str, queue_name: str) -> tuple[str, list[Any]]:
        span, earliest, params = self._span_sql(backend_name, [queue_name], UNLIMITED)
        return (
            f"""
            WITH RECURSIVE {span}
            SELECT MIN(({earliest})) FROM span
            """,
            params,
        )

    def _oldest_limited_sql(self, backend_name: str, count: int) -> tuple[str, list[Any]]:
        sql, params = super()._oldest_limited_sql(backend_name, count)
        forced = f"{self.tasks} FORCE INDEX (sqltasks_ready_limited_at_idx)"
        return sql.replace(self.tasks, forced, 1), params

    def limit_keys(
        self, cursor: CursorWrapper, backend_name: str, after: str, count: int
    ) -> list[str]:
        # One statement a key: MariaDB plans the shared recursive scan's step once and read
        # every READY limited task at each step (6 s for 51 keys beside 20,000 tasks of one
        # key, as fair queues have); each probe here is one descent of the limited ready index.
        sql = (
            f"SELECT limit_key FROM {self.tasks} FORCE INDEX (sqltasks_ready_limited_idx) "
            "WHERE status = 'READY' AND backend_name = %s AND limit_key > %s "
            "ORDER BY limit_key LIMIT 1"
        )
        keys: list[str] = []
        while len(keys) < count:
            cursor.execute(sql, [backend_name, keys[-1] if keys else after])
            row = cursor.fetchone()
            if row is None:
                break
            keys.append(row[0])
        return keys

    def complete(
        self, cursor: CursorWrapper, worker_id: str, outcomes: Sequence[Outcome]
    ) -> set[uuid.UUID]:
        first = "SELECT " + ", ".join(f"%s AS {column}" for column in OUTCOME_COLUMNS)
        rest = "SELECT " + ", ".join(["%s"] * len(OUTCOME_COLUMNS))
        derived = " UNION ALL ".join([first] + [rest] * (len(outcomes) - 1))
        params = [value for o in outcomes for value in self._outcome_params(o)]
        error = self._append_error("t.errors", "v.error_class", "v.error_traceback")
        # A delay counts from the server's clock (_outcome_params made it a time without one).
        later = (
            f"{self._write_clock} + INTERVAL ROUND(v.delay * 1000000) MICROSECOND, "
            if self._write_clock
            else ""
        )
        ids = [self._encode_id(o.id) for o in outcomes]
        marks = ", ".join(["%s"] * len(ids))
        # The owner guard keeps a late result from overwriting a task that was rescued and
        # claimed again (or finished) meanwhile; the attempt guard, one claimed again by
        # another process under the same worker id. Without RETURNING, lock the rows still ours
        # first to learn which they are; the transaction holds those locks for two statements.
        claims = {o.id: o.attempt for o in outcomes}
        with self._atomic():
            cursor.execute(
                f"SELECT id, attempts FROM {self.tasks} WHERE id IN ({marks}) "
                "AND status = 'RUNNING' AND owner = %s FOR UPDATE",
                [*ids, worker_id],
            )
            held = set()
            for values in cursor.fetchall():
                task_id = self._decode_id(values[0])
                if claims[task_id] is None or claims[task_id] == values[1]:
                    held.add(task_id)
            if held:
                cursor.execute(
                    f"""
                    UPDATE {self.tasks} AS t JOIN ({derived}) AS v ON t.id = v.id
                    SET t.errors = IF(v.error_class IS NULL, t.errors, {error}),
                        t.return_value = v.return_value, t.status = v.status,
                        t.finished_at = v.finished_at, t.owner = NULL,
                        t.available_at = COALESCE(v.available_at, {later}t.available_at),
                        t.attempts = t.attempts - v.snoozed, t.snoozes = t.snoozes + v.snoozed
                    WHERE t.status = 'RUNNING' AND t.owner = %s
                        AND (v.attempt IS NULL OR t.attempts = v.attempt)
                    """,
                    [*params, worker_id],
                )
        return held
