"""The claim on MySQL 8 and MariaDB 10.6+: SELECT ... FOR UPDATE SKIP LOCKED of the due tasks,
a few priorities a statement, then an UPDATE of the rows it locked, in one transaction.
Neither has UPDATE ... RETURNING, so the claim reads the rows it locks and computes what the
UPDATE writes, instead of reading them back (``MySQLDialect``'s claim, ``sql/mysql.py``)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from django.db.backends.utils import CursorWrapper

from .rows import CORRUPT_TASK, RETURNED_COLUMNS, UNLIMITED, ClaimedRow, Scope
from .suspects import SuspectStatements

COLUMNS = ", ".join(RETURNED_COLUMNS)
# Priorities one claim SELECT reads ("priority IN (...)"). MariaDB estimates an IN list of more
# than eq_range_index_dive_limit (200) values from statistics, and then read the backend's whole
# index range (deferred tasks included) instead of one range per priority.
PRIORITIES_A_SELECT = 20


class MySQLClaims(SuspectStatements):
    """The claim's statements on MySQL and MariaDB."""

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
