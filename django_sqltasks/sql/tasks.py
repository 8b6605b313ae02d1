"""Statements that write new tasks and read or move one task: the inserts (plain,
deduplicated, bulk), the live task of a dedupe key, one result's row, and making a deferred
task due."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.db.backends.utils import CursorWrapper

from ..core.serialization import dumps
from .rows import INSERT_COLUMNS, NewTask, parked_at
from .vendor import Vendor


class TaskStatements(Vendor):
    """Inserting tasks, and reading or moving one task of the task table."""

    def select_result_sql(self, columns: Sequence[str], *, pruned: bool = False) -> str:
        """A statement reading one task's ``columns`` by id and backend name; ``pruned``, with a
        third parameter, the earliest finished_at the task can have (as ``with_id`` reads)."""
        sql = f"SELECT {', '.join(columns)} FROM {self.tasks} WHERE id = %s AND backend_name = %s"
        if pruned:
            sql += (
                " AND (status IN ('READY', 'RUNNING') OR finished_at >= %s OR finished_at IS NULL)"
            )
        return sql

    def _insert_params(self, task: NewTask) -> list[Any]:
        return [
            self._encode_id(task.id),
            task.task_path,
            task.backend_name,
            task.queue_name,
            task.priority,
            "READY",
            task.args_json or dumps(task.args),
            task.kwargs_json or dumps(task.kwargs),
            "[]",
            "[]",
            0,
            self._encode_datetime(task.enqueued_at),
            self._encode_datetime(task.run_after),
            # With a clock of its own, the database fills in when a task without run_after
            # is due (see _insert_sql): the enqueuing machine's clock may be off.
            self._encode_datetime(
                task.available_at
                or (task.run_after if self._write_clock else task.run_after or task.enqueued_at)
            ),
            task.dedupe_key,
            task.limit_key,
            task.trace_parent,
            None if task.workflow_id is None else self._encode_id(task.workflow_id),
            dumps(task.tags) if task.tags else None,
        ]

    def _insert_sql(self, count: int) -> str:
        j = self._json_placeholder
        due = f"COALESCE(%s, {self._write_clock})" if self._write_clock else "%s"
        row = (
            f"(%s, %s, %s, %s, %s, %s, {j}, {j}, {j}, {j}, %s, %s, %s, {due}, %s, %s, %s, %s, {j})"
        )
        return f"INSERT INTO {self.tasks} ({', '.join(INSERT_COLUMNS)}) VALUES " + ", ".join(
            [row] * count
        )

    def insert_statement(
        self, tasks: Sequence[NewTask], notify: bool = False
    ) -> tuple[str, list[Any]]:
        """One multi-row INSERT of ``tasks``; ``notify`` wakes listening workers."""
        params: list[Any] = []
        for task in tasks:
            params.extend(self._insert_params(task))
        return self._insert_sql(len(tasks)), params

    def insert(self, cursor: CursorWrapper, tasks: Sequence[NewTask], notify: bool = False) -> None:
        """Insert ``tasks`` in one statement, on the caller's connection and transaction."""
        cursor.execute(*self.insert_statement(tasks, notify))

    _bulk_chunk = 1000  # rows per INSERT: under SQLite's 32,766-parameter limit at 19 per row

    def insert_deduplicated(self, cursor: CursorWrapper, task: NewTask, notify: bool) -> bool:
        """Insert ``task`` unless a live task has its dedupe key; return whether it did."""
        sql, params = self.insert_statement([task])
        cursor.execute(f"{sql} ON CONFLICT DO NOTHING RETURNING id", params)
        return cursor.fetchone() is not None

    def bulk_insert(
        self, cursor: CursorWrapper, tasks: Sequence[NewTask], notify: bool = False
    ) -> None:
        """Insert many ``tasks`` on the caller's connection, in as few statements as allowed."""
        for start in range(0, len(tasks), self._bulk_chunk):
            self.insert(cursor, tasks[start : start + self._bulk_chunk], notify=notify)

    def live_task_with_key(self, cursor: CursorWrapper, dedupe_key: str) -> uuid.UUID | None:
        """The id of the READY or RUNNING task holding ``dedupe_key``, if any."""
        cursor.execute(
            f"SELECT id FROM {self.tasks} WHERE dedupe_key = %s AND status IN ('READY', 'RUNNING')",
            [dedupe_key],
        )
        row = cursor.fetchone()
        return None if row is None else self._decode_id(row[0])

    def make_due(self, cursor: CursorWrapper, *, backend_name: str, task_id: uuid.UUID) -> bool:
        """Make a deferred READY task due now, by the database's clock; False if it is not
        READY, is due already (it keeps its place), is a workflow step waiting for its turn
        (PARKED), or does not exist."""
        now, now_params = self._now_sql()
        cursor.execute(
            f"UPDATE {self.tasks} SET available_at = {now} WHERE id = %s AND backend_name = %s "
            f"AND status = 'READY' AND available_at > {now} AND available_at < %s",
            [
                *now_params,
                self._encode_id(task_id),
                backend_name,
                *now_params,
                self._encode_datetime(parked_at()),
            ],
        )
        return cursor.rowcount > 0

    def announce(self, cursor: CursorWrapper, queue_names: Sequence[str]) -> None:
        """Wake the workers of ``queue_names`` now (a queue resumed, a task made due), where
        the database can; elsewhere they see it at their next claim."""

    def finished_among(self, cursor: CursorWrapper, task_ids: Sequence[uuid.UUID]) -> set[str]:
        """Which of ``task_ids`` are SUCCESSFUL or FAILED, as canonical id strings (one query;
        the caller keeps ``task_ids`` to a few hundred)."""
        if not task_ids:
            return set()
        cursor.execute(
            f"SELECT id FROM {self.tasks} WHERE id IN ({', '.join(['%s'] * len(task_ids))}) "
            "AND status IN ('SUCCESSFUL', 'FAILED')",
            [self._encode_id(task_id) for task_id in task_ids],
        )
        return {str(self._decode_id(row[0])) for row in cursor.fetchall()}
