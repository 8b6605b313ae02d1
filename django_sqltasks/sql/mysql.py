"""MySQL 8 and MariaDB 10.6+: SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE, in one transaction.

Neither has UPDATE ... RETURNING, so the claim reads the rows it locks and computes what the
UPDATE writes, instead of reading them back.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.backends.utils import CursorWrapper

from .base import (
    CORRUPT_TASK,
    OUTCOME_COLUMNS,
    RETURNED_COLUMNS,
    ClaimedRow,
    Dialect,
    NewTask,
    Outcome,
)

COLUMNS = ", ".join(RETURNED_COLUMNS)


class MySQLDialect(Dialect):
    def append_error(self, column: str, class_sql: str, traceback_sql: str) -> str:
        return (
            f"JSON_ARRAY_APPEND({column}, '$', JSON_OBJECT("
            f"'exception_class_path', {class_sql}, 'traceback', {traceback_sql}))"
        )

    def concat(self, *parts: str) -> str:
        return f"CONCAT({', '.join(parts)})"

    def insert_deduplicated(self, cursor: CursorWrapper, task: NewTask, notify: bool) -> bool:
        # No ON CONFLICT DO NOTHING (INSERT IGNORE would hide other errors too): try, and
        # roll back to a savepoint on the one duplicate we expect.
        try:
            with transaction.atomic(using=self.connection.alias):
                self.insert(cursor, [task])
        except IntegrityError as e:
            if "sqltasks_dedupe_live" not in str(e):
                raise
            return False
        return True

    def claim(
        self,
        cursor: CursorWrapper,
        *,
        backend_name: str,
        queue_names: list[str] | None,
        worker_id: str,
        now: datetime,
        limit: int,
    ) -> list[ClaimedRow]:
        at = self.encode_datetime(now)
        # The selected rows stay locked until this transaction commits: keep it to these two
        # statements.
        with transaction.atomic(using=self.connection.alias):
            cursor.execute(
                *self.claim_sql(
                    backend_name=backend_name,
                    queue_names=queue_names,
                    worker_id=worker_id,
                    now=now,
                    limit=limit,
                )
            )
            rows = self.fetch_claimed(cursor)
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
                [worker_id, worker_id, at, at, *(self.encode_id(r.id) for r in rows)],
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
                    self.encode_id(row.id),
                ],
            )

    def claim_sql(
        self,
        *,
        backend_name: str,
        queue_names: list[str] | None,
        worker_id: str,
        now: datetime,
        limit: int,
    ) -> tuple[str, list[Any]]:
        queue_sql, queue_params = self.queue_filter(queue_names)
        return (
            f"""
            SELECT {COLUMNS} FROM {self.tasks}
            WHERE status = 'READY' AND backend_name = %s{queue_sql} AND available_at <= %s
            ORDER BY priority DESC, available_at
            LIMIT %s
            FOR UPDATE SKIP LOCKED
            """,
            [backend_name, *queue_params, self.encode_datetime(now), limit],
        )

    def complete(
        self, cursor: CursorWrapper, worker_id: str, outcomes: Sequence[Outcome]
    ) -> set[uuid.UUID]:
        first = "SELECT " + ", ".join(f"%s AS {column}" for column in OUTCOME_COLUMNS)
        rest = "SELECT " + ", ".join(["%s"] * len(OUTCOME_COLUMNS))
        derived = " UNION ALL ".join([first] + [rest] * (len(outcomes) - 1))
        params = [value for o in outcomes for value in self.outcome_params(o)]
        error = self.append_error("t.errors", "v.error_class", "v.error_traceback")
        ids = [self.encode_id(o.id) for o in outcomes]
        marks = ", ".join(["%s"] * len(ids))
        # The owner guard keeps a late result from overwriting a task that was rescued and
        # claimed again (or finished) meanwhile. Without RETURNING, lock the rows still ours
        # first to learn which they are; the transaction holds those locks for two statements.
        with transaction.atomic(using=self.connection.alias):
            cursor.execute(
                f"SELECT id FROM {self.tasks} WHERE id IN ({marks}) AND status = 'RUNNING' "
                "AND owner = %s FOR UPDATE",
                [*ids, worker_id],
            )
            held = {self.decode_id(values[0]) for values in cursor.fetchall()}
            if held:
                cursor.execute(
                    f"""
                    UPDATE {self.tasks} AS t JOIN ({derived}) AS v ON t.id = v.id
                    SET t.errors = IF(v.error_class IS NULL, t.errors, {error}),
                        t.return_value = v.return_value, t.status = v.status,
                        t.finished_at = v.finished_at, t.owner = NULL,
                        t.available_at = COALESCE(v.available_at, t.available_at)
                    WHERE t.status = 'RUNNING' AND t.owner = %s
                    """,
                    [*params, worker_id],
                )
        return held
