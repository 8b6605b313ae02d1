"""Statements that claim due tasks: the claim and its conditions (the ready indexes, the
paused queues, the walk over priorities), on which the claims of suspects (``suspects.py``)
and of limit keys (``limit_keys.py``) build."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from django.db.backends.utils import CursorWrapper

from ..compat import task_backends
from .marks import ClaimMarks
from .rows import (
    ANY_LIMIT,
    UNLIMITED,
    ClaimedRow,
    Scope,
)
from .vendor import Vendor


def claims_commit_relaxed(backend_name: str) -> bool:
    """Whether ``backend_name``'s claims commit without waiting for the disk: its OPTIONS
    CLAIM_SYNCHRONOUS_COMMIT is False (the default). Enqueues, outcomes and requeues always
    wait. False for a name that is not a configured SQLTaskBackend (a test's dialect call)."""
    try:
        config: Any = getattr(task_backends[backend_name], "config", None)
        return config.claim_synchronous_commit is False
    except Exception:  # not a configured SQLTaskBackend: durable
        return False


class ClaimStatements(Vendor):
    """Taking due tasks for a worker, and reading back the rows it took."""

    def claim_sql(
        self,
        *,
        backend_name: str,
        queue_names: list[str] | None,
        worker_id: str,
        limit: int,
        scope: Scope = UNLIMITED,
    ) -> tuple[str, list[Any]]:
        """The statement that claims (or, on MySQL, locks) up to ``limit`` due tasks of any
        priority: those whose ``available_at`` has come by the database's clock."""
        ready = self._ready_where(backend_name, queue_names, scope)
        index = self._ready_index(queue_names, scope)
        return self._claim_step_sql(ready, worker_id, limit, None, index)

    def claim(
        self,
        cursor: CursorWrapper,
        *,
        backend_name: str,
        queue_names: list[str] | None,
        worker_id: str,
        limit: int,
        scope: Scope = UNLIMITED,
        marks: ClaimMarks | None = None,
    ) -> list[ClaimedRow]:
        """Mark up to ``limit`` due tasks RUNNING for ``worker_id`` and return them; where the
        database supports it, each priority read from its place in ``marks`` (sql/marks.py),
        which the claim moves on. Here, from the start: ``marks`` is not used."""
        # First the priorities that have due tasks, without a lock; then one claim statement
        # for the highest of them (``_priorities_a_statement`` at a time), then the next,
        # until the batch is full: each reads one index range of due tasks per priority, never
        # a deferred one. With nothing due, the claim ends here, before any lock.
        cursor.execute(*self._due_priorities_sql(backend_name, queue_names, scope))
        priorities = [values[0] for values in cursor.fetchall()]
        if not priorities:
            return []
        ready = self._ready_where(backend_name, queue_names, scope)
        index = self._ready_index(queue_names, scope)
        step = self._priorities_a_statement
        with self._claim_transaction(backend_name):
            taken: list[Any] = []
            for start in range(0, len(priorities), step):
                chosen = priorities[start : start + step]
                cursor.execute(
                    *self._claim_step_sql(ready, worker_id, limit - len(taken), chosen, index)
                )
                taken.extend(self._claim_step_rows(cursor))
                if len(taken) >= limit:
                    break
            return self._take(cursor, taken, worker_id)

    # The claim's walk over priorities, for the databases that claim one statement at a time
    # (PostgreSQL claims in one statement instead): how many priorities a statement reads,
    # the statement, the transaction the statements share and what each returns.
    _priorities_a_statement = 1

    def _claim_step_sql(
        self,
        ready: tuple[str, list[Any]],
        worker_id: str,
        limit: int,
        priorities: Sequence[int] | None,
        index: str | None = None,
    ) -> tuple[str, list[Any]]:
        """One claim statement: up to ``limit`` due tasks that meet ``ready`` (the conditions
        of ``_ready_where``, and their parameters), of ``priorities`` (None: of any), read
        through ``index`` (``_ready_index``) where the database must be told."""
        raise NotImplementedError

    def _claim_transaction(self, backend_name: str) -> AbstractContextManager[object]:
        """The transaction a claim's statements share, for ``backend_name``'s claim: none,
        each claims and commits alone."""
        return nullcontext()

    def _claim_step_rows(self, cursor: CursorWrapper) -> list[Any]:
        """What one claim statement returned: the rows it claimed."""
        return self._fetch_claimed(cursor)

    def _take(self, cursor: CursorWrapper, taken: list[Any], worker_id: str) -> list[ClaimedRow]:
        """The claimed rows from what the claim's statements returned (the rows themselves)."""
        return taken

    def _fetch_claimed(self, cursor: CursorWrapper) -> list[ClaimedRow]:
        """The rows the claim statement just returned."""
        return [self._claimed_row(values) for values in cursor.fetchall()]

    def _ready_where(
        self, backend_name: str, queue_names: list[str] | None, scope: Scope
    ) -> tuple[str, list[Any]]:
        """The claim's conditions besides the due time and the priority: READY, of this
        backend, in the ``scope``'s limit key and queues, not paused. Each form is served by a
        ready index."""
        queue_sql, queue_params = self._queue_filter(queue_names, backend_name)
        if scope.exclude_queues:
            marks = ", ".join(["%s"] * len(scope.exclude_queues))
            queue_sql += f" AND queue_name NOT IN ({marks})"
            queue_params = [*queue_params, *scope.exclude_queues]
        limit_sql, limit_params = self._limit_condition(scope)
        return (
            f"status = 'READY'{limit_sql} AND backend_name = %s{queue_sql}",
            [*limit_params, backend_name, *queue_params],
        )

    @staticmethod
    def _limit_condition(scope: Scope) -> tuple[str, list[Any]]:
        if scope.limit_key is ANY_LIMIT:
            return "", []
        if scope.limit_key is None:
            return " AND limit_key IS NULL", []
        if scope.priority is not None:  # the fair claim's: one priority of one key
            return " AND limit_key = %s AND priority = %s", [scope.limit_key, scope.priority]
        return " AND limit_key = %s", [scope.limit_key]

    def _queue_filter(
        self, queue_names: list[str] | None, backend_name: str
    ) -> tuple[str, list[Any]]:
        """The claim's conditions on the queue: one of ``queue_names`` (None: any), and not
        paused. The paused queues are read once per statement (an uncorrelated subquery) and
        each row is checked against them as a filter of the claim's index scan: a correlated
        NOT EXISTS was planned as an anti-join that sorted every due row of the queue (610 ms
        a claim beside 1,000,000 due tasks, against 2 ms)."""
        paused = f" AND queue_name {self._not_in_paused}"
        paused_params = [backend_name]
        if queue_names is None:
            return paused, paused_params
        marks = ", ".join(["%s"] * len(queue_names))
        return f" AND queue_name IN ({marks}){paused}", [*queue_names, *paused_params]

    @property
    def _not_in_paused(self) -> str:
        """SQL for "not one of this backend's paused queues" (after a column name)."""
        return f"NOT IN (SELECT queue_name FROM {self.paused} WHERE backend_name = %s)"

    def _ready_prefix(
        self, backend_name: str, queue_names: list[str] | None, scope: Scope
    ) -> tuple[str, list[Any]]:
        """The claim's conditions on the columns that lead its ready index: READY, the
        ``scope``'s limit key, the backend, and the queue of a worker on one queue."""
        limit_sql, params = self._limit_condition(scope)
        prefix = f"status = 'READY'{limit_sql} AND backend_name = %s"
        params = [*params, backend_name]
        if scope.limit_key is None and queue_names is not None and len(queue_names) == 1:
            prefix += " AND queue_name = %s"
            params.append(queue_names[0])
        return prefix, params

    @staticmethod
    def _ready_index(queue_names: list[str] | None, scope: Scope) -> str | None:
        """The ready index that ``_ready_prefix`` leads (None for ``ANY_LIMIT``: no one index)."""
        if scope.limit_key is ANY_LIMIT:
            return None
        if scope.limit_key is not None:
            return "sqltasks_ready_limited_idx"
        if queue_names is not None and len(queue_names) == 1:
            return "sqltasks_ready_idx"
        return "sqltasks_ready_all_idx"

    def _priorities_sql(
        self, backend_name: str, queue_names: list[str] | None, scope: Scope
    ) -> tuple[str, list[Any]]:
        """A recursive CTE, ``priorities(p)``: the priorities of the READY tasks a claim may
        take, highest first, then one NULL; one probe of the ready index each, however many
        tasks each has. A claim that takes the due tasks of one priority at a time, from the
        index range that ends at the current time, reads no task that is not due; in the one
        range ``priority DESC, available_at``, every deferred task of a higher priority came
        before the first due task of a lower one."""
        prefix, params = self._ready_prefix(backend_name, queue_names, scope)
        probe = f"SELECT priority FROM {self.tasks} WHERE {prefix}"
        order = "ORDER BY priority DESC LIMIT 1"
        return (
            f"""
            priorities(p) AS (
                SELECT ({probe} {order})
                UNION ALL
                SELECT ({probe} AND priority < priorities.p {order})
                FROM priorities WHERE priorities.p IS NOT NULL
            )
            """,
            [*params, *params],
        )

    def _due_priorities_sql(
        self, backend_name: str, queue_names: list[str] | None, scope: Scope = UNLIMITED
    ) -> tuple[str, list[Any]]:
        """The priorities, highest first, that have a due READY task a claim may take: the
        earliest task of each priority in ``_priorities_sql`` is due (one probe each)."""
        prefix, prefix_params = self._ready_prefix(backend_name, queue_names, scope)
        priorities, priority_params = self._priorities_sql(backend_name, queue_names, scope)
        now, now_params = self._now_sql()
        return (
            f"""
            WITH RECURSIVE {priorities}
            SELECT p FROM priorities WHERE p IS NOT NULL AND (
                SELECT available_at FROM {self.tasks} WHERE {prefix} AND priority = priorities.p
                ORDER BY available_at LIMIT 1
            ) <= {now}
            ORDER BY p DESC
            """,
            [*priority_params, *prefix_params, *now_params],
        )

    def due_priorities(
        self,
        cursor: CursorWrapper,
        *,
        backend_name: str,
        queue_names: list[str] | None,
        scope: Scope,
    ) -> list[int]:
        """The priorities, highest first, that have a due READY task in ``scope``."""
        cursor.execute(*self._due_priorities_sql(backend_name, queue_names, scope))
        return [values[0] for values in cursor.fetchall()]
