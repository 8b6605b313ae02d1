"""Statements on suspects, the tasks beside which their worker died: finding those a worker
may take, best first, taking one by its id, and clearing one that ran past its time bound."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.backends.utils import CursorWrapper

from ..compat import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY
from .claims import ClaimStatements
from .rows import (
    ANY_LIMIT,
    SUSPECT,
    SUSPECT_CLEARED,
    SUSPECT_TOGETHER,
    SUSPECT_UNBOUNDED,
    UNLIMITED,
    ClaimedRow,
    Scope,
    SuspectRow,
    stored,
)


class SuspectStatements(ClaimStatements):
    """Finding and taking suspects, within the claim's conditions."""

    def _suspect_marks(self) -> list[Any]:
        """The marks of a suspect waiting to run (SUSPECT, SUSPECT_UNBOUNDED, SUSPECT_TOGETHER),
        for ``available_at IN (%s, %s, %s)``."""
        return [
            self._encode_datetime(stored(m)) for m in (SUSPECT, SUSPECT_UNBOUNDED, SUSPECT_TOGETHER)
        ]

    def _suspects_sql(
        self, backend_name: str, queue_names: list[str] | None, limit: int, limited: bool
    ) -> tuple[str, list[Any]]:
        """Up to ``limit`` suspects (id, kind, limit key, queue) a worker on ``queue_names``
        may take, best first: of no limit key (one probe of its ready index per priority and
        mark), or (``limited``) of any (a range of sqltasks_ready_limited_at_idx: suspects
        are few, but their keys may be many)."""
        scope = Scope(limit_key=ANY_LIMIT) if limited else UNLIMITED
        where, params = self._ready_where(backend_name, queue_names, scope)
        if limited:  # sqltasks_ready_limited_at_idx: the marks' range of limited tasks
            where += " AND limit_key IS NOT NULL"
            priorities: list[int] = []
        else:  # sqltasks_ready_all_idx: one probe per priority and mark
            priorities = list(range(TASK_MAX_PRIORITY, TASK_MIN_PRIORITY - 1, -1))
            marks = ", ".join(["%s"] * len(priorities))
            where += f" AND priority IN ({marks})"
        # kind: 1 a suspect with a time bound, 2 one to run beside others, 0 neither.
        return (
            "SELECT id, CASE WHEN available_at = %s THEN 1 WHEN available_at = %s THEN 2 "
            "ELSE 0 END, limit_key, queue_name, priority "
            f"FROM {self.tasks} WHERE {where} "
            "AND available_at IN (%s, %s, %s) ORDER BY priority DESC, id LIMIT %s",
            [
                self._encode_datetime(stored(SUSPECT)),
                self._encode_datetime(stored(SUSPECT_TOGETHER)),
                *params,
                *priorities,
                *self._suspect_marks(),
                limit,
            ],
        )

    def suspects(
        self,
        cursor: CursorWrapper,
        *,
        backend_name: str,
        queue_names: list[str] | None,
        limit: int,
    ) -> list[SuspectRow]:
        """Up to ``limit`` suspects a worker on ``queue_names`` may take, best first."""
        found: list[tuple[Any, ...]] = []
        for limited in (False, True):
            cursor.execute(*self._suspects_sql(backend_name, queue_names, limit, limited))
            found += cursor.fetchall()
        found.sort(key=lambda values: -values[4])  # stable: by id within a priority
        rows = [
            SuspectRow(
                id=self._decode_id(values[0]),
                bounded=values[1] == 1,
                limit_key=values[2],
                queue_name=values[3],
                together=values[1] == 2,
            )
            for values in found
        ]
        return rows[:limit]

    def suspects_waiting(
        self, cursor: CursorWrapper, *, backend_name: str, queue_names: list[str] | None
    ) -> bool:
        """Whether a suspect waits that a worker on ``queue_names`` may take."""
        found = self.suspects(cursor, backend_name=backend_name, queue_names=queue_names, limit=1)
        return bool(found)

    def claim_suspect_by_id(
        self, cursor: CursorWrapper, task_id: uuid.UUID, worker_id: str
    ) -> ClaimedRow | None:
        """Mark suspect ``task_id`` RUNNING for ``worker_id`` (None if another took it). It
        keeps its mark while it runs: if its worker dies, the rescue charges it (SUSPECT,
        SUSPECT_UNBOUNDED) or makes it one to run alone (SUSPECT_TOGETHER)."""
        raise NotImplementedError

    def clear_suspect(self, cursor: CursorWrapper, task_id: uuid.UUID, worker_id: str) -> bool:
        """Mark ``worker_id``'s running suspect ``task_id``, past its time bound, cleared
        (SUSPECT_CLEARED): its worker may take the next suspect, and a rescue no longer
        charges it. False if it is not running there as a suspect with a time bound."""
        cursor.execute(
            f"UPDATE {self.tasks} SET available_at = %s WHERE id = %s AND status = 'RUNNING' "
            "AND owner = %s AND available_at = %s",
            [
                self._encode_datetime(stored(SUSPECT_CLEARED)),
                self._encode_id(task_id),
                worker_id,
                self._encode_datetime(stored(SUSPECT)),
            ],
        )
        return cursor.rowcount > 0
