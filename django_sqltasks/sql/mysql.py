"""MySQL 8 and MariaDB 10.6+: SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE, in one transaction.

Neither has UPDATE ... RETURNING, so the claim reads the rows it locks and computes what the
UPDATE writes, instead of reading them back.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError, InterfaceError
from django.db.backends.utils import CursorWrapper

from . import health, probes
from .dialect import Dialect
from .errors import driver_error
from .mysql_claims import MySQLClaims
from .rows import (
    OUTCOME_COLUMNS,
    UNLIMITED,
    NewTask,
    Outcome,
    TableHealth,
)

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


# The attribute that caches the server's max_allowed_packet on a DB-API connection object, so
# a new connection (after a reconnect, or CONN_MAX_AGE) reads it again.
PACKET_CACHE_ATTRIBUTE = "_sqltasks_max_allowed_packet"
# Asked of the server once per connection; a read of a variable, not a query of the tables.
MAX_ALLOWED_PACKET_SQL = "SELECT @@max_allowed_packet"


class MySQLDialect(probes.MySQLProbe, MySQLClaims, Dialect):
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
