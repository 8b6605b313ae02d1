"""Statements on limit keys: the keys of READY limited tasks (those enqueued since an id, or
every key in order), and the fair claim's round over keys (each key's due priorities, and
one claim for the round's keys)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.backends.utils import CursorWrapper

from .claims import ClaimStatements
from .rows import ClaimedRow, Scope


class LimitKeyStatements(ClaimStatements):
    """The keys of limited tasks, and the claim of them key by key."""

    def due_priorities_of_keys(
        self,
        cursor: CursorWrapper,
        *,
        backend_name: str,
        queue_names: list[str] | None,
        keys: Sequence[str],
    ) -> list[list[int]]:
        """``due_priorities`` of the tasks of each of ``keys`` (the fair claim's round)."""
        return [
            self.due_priorities(
                cursor,
                backend_name=backend_name,
                queue_names=queue_names,
                scope=Scope(limit_key=key),
            )
            for key in keys
        ]

    def claim_of_keys(
        self,
        cursor: CursorWrapper,
        *,
        backend_name: str,
        queue_names: list[str] | None,
        exclude_queues: tuple[str, ...],
        worker_id: str,
        priority: int,
        wants: Sequence[tuple[str, int]],
    ) -> list[list[ClaimedRow]]:
        """Claim, for each (key, count) of ``wants``, up to count due tasks of that limit key
        and ``priority`` (the fair claim's pass); the rows of each, in order."""
        return [
            self.claim(
                cursor,
                backend_name=backend_name,
                queue_names=queue_names,
                worker_id=worker_id,
                limit=count,
                scope=Scope(limit_key=key, exclude_queues=exclude_queues, priority=priority),
            )
            for key, count in wants
        ]

    def limit_keys_since(
        self, cursor: CursorWrapper, backend_name: str, after: Any, count: int
    ) -> tuple[list[str], Any]:
        """The limit keys of READY tasks enqueued after task id ``after`` (ids grow with time:
        UUIDv7), reading up to ``count`` rows, and the id to go on from: one range of the
        primary key, as long as what was enqueued since, however many keys wait. ``after``
        None: no key, and the last id now."""
        if after is None:
            cursor.execute(f"SELECT id FROM {self.tasks} ORDER BY id DESC LIMIT 1")
            row = cursor.fetchone()
            return [], (row[0] if row else None)
        cursor.execute(
            f"SELECT id, limit_key, status, backend_name FROM {self.tasks} WHERE id > %s "
            "ORDER BY id LIMIT %s",
            [after, count],
        )
        rows = cursor.fetchall()
        keys = {
            key
            for _, key, status, backend in rows
            if key is not None and status == "READY" and backend == backend_name
        }
        return sorted(keys), (rows[-1][0] if rows else after)

    def limit_keys(
        self, cursor: CursorWrapper, backend_name: str, after: str, count: int
    ) -> list[str]:
        """Up to ``count`` distinct limit keys of READY tasks, in order, after ``after``: a
        loose scan of the limited ready index, one probe a key, however many tasks each has."""
        # The next key after a given one: one descent of the limited ready index.
        sql = (
            f"SELECT limit_key FROM {self.tasks} WHERE status = 'READY' AND backend_name = %s "
            "AND limit_key > "
        )
        cursor.execute(
            f"""
            WITH RECURSIVE found(k, n) AS (
                SELECT ({sql}%s ORDER BY limit_key LIMIT 1), 1
                UNION ALL
                SELECT ({sql}found.k ORDER BY limit_key LIMIT 1), n + 1
                FROM found WHERE found.k IS NOT NULL AND n < %s
            )
            SELECT k FROM found WHERE k IS NOT NULL
            """,
            [backend_name, after, backend_name, count],
        )
        return [row[0] for row in cursor.fetchall()]
