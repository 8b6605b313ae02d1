"""Statements that end an attempt: an outcome written (in batches, guarded by the owner), a
salvage when it cannot be, and tasks put back in the queue when their worker stopped or died."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db.backends.utils import CursorWrapper
from django.utils import timezone as dj_timezone

from ..core.serialization import dumps
from ..core.storable import storable
from .rows import (
    OUTCOME_NOT_STORED,
    SUSPECT,
    SUSPECT_CLEARED,
    SUSPECT_TOGETHER,
    SUSPECT_UNBOUNDED,
    WORKER_LOST,
    WORKER_STOPPED,
    Outcome,
    stored,
)
from .vendor import Vendor

MAX_REASON = 10_000  # characters of a salvage reason kept
# Text around the lost worker's id in the error a rescue appends to a task.
ORPHAN_MESSAGE = (
    "Worker ",
    " stopped heartbeating while running this task; it was put back in the queue.",
)
# The end of that error for a task that ran beside others, any of which may have killed the
# worker: it runs alone next time, and is charged a rescue only if its worker dies then.
ORPHAN_SUSPECT = (
    " stopped heartbeating while running this task beside others; it was put back in the "
    "queue, to run beside the other tasks that lost a worker next time (a task that kills its "
    "worker there too runs alone after that)."
)
# The end of that error for a suspect that ran beside other suspects (SUSPECT_TOGETHER): it
# runs alone next time, and is charged a rescue only if its worker dies then.
ORPHAN_TOGETHER = (
    " stopped heartbeating again while running this task beside others; it was put back in "
    "the queue, to run alone next time."
)
# The end of that error for a suspect its worker had cleared (it ran alone past its time
# bound): it runs alone next time until it ends.
ORPHAN_CLEARED = (
    " stopped heartbeating while running this task beside others, after it had run alone past "
    "its time bound; it was put back in the queue, to run alone until it ends next time."
)
# The end of that error instead, when the task has used up its rescues (MAX_RESCUES).
ORPHAN_GIVE_UP = (
    " stopped heartbeating while running this task; it had been put back in the queue {n} "
    "time(s) after losing its worker (MAX_RESCUES is {n}), so it failed."
)


class OutcomeStatements(Vendor):
    """Writing how attempts ended, and putting back the tasks of stopped or lost workers."""

    def outcome_problem(self, outcome: Outcome) -> str | None:
        """Say why ``outcome`` cannot be written as it is (too large for one statement, say),
        before trying; None if nothing is known against it."""
        return None

    def _outcome_params(self, outcome: Outcome) -> list[Any]:
        """An outcome's values in the order of OUTCOME_COLUMNS. Where this process's clock is
        the database's (``_write_clock`` None), a delay is made a time here."""
        available_at, delay = outcome.available_at, outcome.delay
        if self._write_clock is None and delay is not None:
            available_at = available_at or dj_timezone.now() + timedelta(seconds=delay)
            delay = None
        return [
            self._encode_id(outcome.id),
            outcome.status,
            self._encode_datetime(outcome.finished_at),
            outcome.return_value,
            outcome.error_class,
            outcome.error_traceback,
            self._encode_datetime(available_at),
            outcome.snoozed,
            delay,
            outcome.attempt,
        ]

    def complete(
        self, cursor: CursorWrapper, worker_id: str, outcomes: Sequence[Outcome]
    ) -> set[uuid.UUID]:
        """Record ``outcomes`` of tasks still held by ``worker_id``; return the ids written."""
        raise NotImplementedError

    def salvage(
        self, cursor: CursorWrapper, worker_id: str, outcome: Outcome, reason: str
    ) -> set[uuid.UUID]:
        """Mark a task FAILED when its outcome could not be stored as it was.

        The errors column is replaced by one error saying why: it may be what broke the write.
        """
        error = dumps(
            [
                {
                    "exception_class_path": OUTCOME_NOT_STORED,
                    "traceback": storable(reason, MAX_REASON, "reason"),
                }
            ]
        )
        # Guarded as an outcome is: by the owner, and by the claim's attempt if known.
        same_claim, attempt = (
            ("", []) if outcome.attempt is None else (" AND attempts = %s", [outcome.attempt])
        )
        cursor.execute(
            f"UPDATE {self.tasks} SET status = 'FAILED', finished_at = %s, owner = NULL, "
            f"return_value = NULL, errors = {self._json_placeholder} "
            f"WHERE id = %s AND status = 'RUNNING' AND owner = %s{same_claim}",
            [
                self._encode_datetime(
                    outcome.finished_at or outcome.available_at or dj_timezone.now()
                ),
                error,
                self._encode_id(outcome.id),
                worker_id,
                *attempt,
            ],
        )
        if not cursor.rowcount:
            return set()
        self.announce_finished(cursor, [outcome.id])  # its waiters, at once where they can be
        return {outcome.id}

    # Pieces of SQL that differ by vendor, used by the shared statements below.
    _text_param = "%s"

    def _append_error(self, column: str, class_sql: str, traceback_sql: str) -> str:
        """SQL for ``column`` (a JSON list) with one {exception_class_path, traceback} appended."""
        raise NotImplementedError

    def _concat(self, *parts: str) -> str:
        return " || ".join(parts)

    def requeue_orphans(
        self,
        cursor: CursorWrapper,
        *,
        backend_name: str,
        lease_timeout: float,
        max_rescues: int | None = None,
    ) -> int:
        """Put RUNNING tasks whose owner has not heartbeaten for ``lease_timeout`` seconds (by
        the database's clock) back in the queue. A task that ran alone (a suspect, SUSPECT or
        SUSPECT_UNBOUNDED, or the one task its worker ran) is charged a rescue, and fails once
        it was rescued ``max_rescues`` times already (a task that kills its worker); the others
        become suspects, limited or not: of a first death (SUSPECT_TOGETHER), run beside each
        other next; one that died beside others as such a suspect already, to run alone
        (SUSPECT); a suspect its worker had cleared (SUSPECT_CLEARED), alone with no time bound
        next time."""
        lone = self.lone_orphans(cursor, backend_name=backend_name, lease_timeout=lease_timeout)
        if lone is None:
            return 0
        cursor.execute(
            *self.requeue_orphans_sql(
                backend_name=backend_name,
                lease_timeout=lease_timeout,
                max_rescues=max_rescues,
                lone=lone,
            )
        )
        return cursor.rowcount

    def _marks(self, *marks: Any) -> list[Any]:
        return [self._encode_datetime(stored(mark)) for mark in marks]

    def _orphaned_sql(self, backend_name: str, lease_timeout: float) -> tuple[str, list[Any]]:
        """The condition on ``t`` of a RUNNING task whose owner stopped heartbeating."""
        live_since, live_params = self._ago_sql(lease_timeout)
        return (
            f"t.backend_name = %s AND (t.owner IS NULL OR NOT EXISTS (SELECT 1 FROM "
            f"{self.workers} w WHERE w.id = t.owner AND w.heartbeat_at >= {live_since}))",
            [backend_name, *live_params],
        )

    def lone_orphans(
        self, cursor: CursorWrapper, *, backend_name: str, lease_timeout: float
    ) -> list[str] | None:
        """The lost workers (see ``requeue_orphans``) that ran one task: nothing beside it
        could have killed them; None if no task has a lost worker (no rescue to write, the
        usual case). Read before the rescue writes, in a statement of its own: a database
        that evaluates an UPDATE row by row (SQLite; MySQL may) would see the workers' first
        rows written already, and count the task beside a failed one as its worker's only
        one."""
        where, params = self._orphaned_sql(backend_name, lease_timeout)
        cursor.execute(
            f"SELECT t.owner, COUNT(*) FROM {self.tasks} t WHERE t.status = 'RUNNING' "
            f"AND {where} GROUP BY t.owner",
            params,
        )
        rows = cursor.fetchall()
        if not rows:
            return None
        return [owner for owner, count in rows if owner is not None and count == 1]

    def requeue_orphans_sql(
        self,
        *,
        backend_name: str,
        lease_timeout: float,
        max_rescues: int | None = None,
        lone: Sequence[str] = (),
    ) -> tuple[str, list[Any]]:
        """The rescue statement (see ``requeue_orphans``); ``lone``: the lost workers that ran
        one task (``lone_orphans``)."""
        owner = "COALESCE(t.owner, '(none)')"
        # Charged: a suspect, or the one task its worker ran (nothing beside it could have
        # killed the worker).
        if lone:
            charged = (
                f"(t.available_at IN (%s, %s) OR t.owner IN ({', '.join(['%s'] * len(lone))}))"
            )
        else:
            charged = "t.available_at IN (%s, %s)"
        charged_params = [*self._marks(SUSPECT, SUSPECT_UNBOUNDED), *lone]
        p = self._text_param
        ends = (
            f"CASE WHEN {charged} THEN {p} WHEN t.available_at = %s THEN {p} "
            f"WHEN t.available_at = %s THEN {p} ELSE {p} END"
        )
        ends_params = [
            *charged_params,
            ORPHAN_MESSAGE[1],
            *self._marks(SUSPECT_CLEARED),
            ORPHAN_CLEARED,
            *self._marks(SUSPECT_TOGETHER),
            ORPHAN_TOGETHER,
            ORPHAN_SUSPECT,
        ]
        if max_rescues is None:
            message_sql = self._concat(p, owner, ends)
            message_params: list[Any] = [ORPHAN_MESSAGE[0], *ends_params]
            fail_when = None
        else:
            given_up = f"{charged} AND t.rescues >= %s"
            given_up_params = [*charged_params, max_rescues]
            message_sql = self._concat(p, owner, f"CASE WHEN {given_up} THEN {p} ELSE {ends} END")
            message_params = [
                ORPHAN_MESSAGE[0],
                *given_up_params,
                ORPHAN_GIVE_UP.format(n=max_rescues),
                *ends_params,
            ]
            fail_when = (given_up, given_up_params)
        where, where_params = self._orphaned_sql(backend_name, lease_timeout)
        return self._requeue_sql(
            where=where,
            where_params=where_params,
            error_class=WORKER_LOST,
            message_sql=message_sql,
            message_params=message_params,
            fail_when=fail_when,
            rescue=(charged, charged_params),
        )

    def requeue_owned(
        self,
        cursor: CursorWrapper,
        *,
        worker_id: str,
        reason: str,
        keep: Sequence[uuid.UUID] = (),
    ) -> int:
        """Put RUNNING tasks of ``worker_id`` but ``keep`` back to READY, recording ``reason``."""
        where, params = "t.owner = %s", [worker_id]
        if keep:
            where += f" AND t.id NOT IN ({', '.join(['%s'] * len(keep))})"
            params += [self._encode_id(task_id) for task_id in keep]
        cursor.execute(
            *self._requeue_sql(
                where=where,
                where_params=params,
                error_class=WORKER_STOPPED,
                message_sql=self._text_param,
                message_params=[reason],
            )
        )
        return cursor.rowcount

    def _requeue_sql(
        self,
        *,
        where: str,
        where_params: list[Any],
        error_class: str,
        message_sql: str,
        message_params: list[Any],
        fail_when: tuple[str, list[Any]] | None = None,
        rescue: tuple[str, list[Any]] | None = None,
    ) -> tuple[str, list[Any]]:
        """Put matching RUNNING tasks back to READY with an error appended; those matching
        ``fail_when`` (SQL, params) become FAILED instead. A ``rescue`` (the SQL, and its
        params, of the rows charged a rescue) counts a rescue on those rows and makes the
        others suspects (see SUSPECT)."""
        error = self._append_error("t.errors", self._text_param, message_sql)
        now, now_params = self._now_sql()
        if fail_when is None:
            status_sql, status_params = "'READY'", []
            finished_sql, finished_params = "t.finished_at", []
        else:
            condition, condition_params = fail_when
            status_sql = f"CASE WHEN {condition} THEN 'FAILED' ELSE 'READY' END"
            status_params = list(condition_params)
            finished_sql = f"CASE WHEN {condition} THEN {now} ELSE t.finished_at END"
            finished_params = [*condition_params, *now_params]
        rescues_sql, rescues_params = "", []
        # A stop (or a failed claim) puts a suspect back as one, a cleared one with its time
        # bound again; other tasks are due at once.
        available_sql = (
            f"CASE WHEN t.available_at IN (%s, %s) THEN t.available_at "
            f"WHEN t.available_at IN (%s, %s) THEN %s ELSE {now} END"
        )
        available_params = [
            *self._marks(SUSPECT_UNBOUNDED, SUSPECT_TOGETHER),
            *self._marks(SUSPECT, SUSPECT_CLEARED, SUSPECT),
            *now_params,
        ]
        if rescue is not None:
            charged, charged_params = rescue
            rescues_sql = f", rescues = t.rescues + CASE WHEN {charged} THEN 1 ELSE 0 END"
            rescues_params = list(charged_params)
            # A rescue makes every task a suspect (any of them may have killed the worker),
            # limited ones too: the suspects' claim keeps their limits. A task of a first death
            # runs beside the others next (SUSPECT_TOGETHER); one charged, or a suspect that
            # ran beside others as such already, runs alone (SUSPECT). One the worker had
            # cleared, or an unbounded one, runs alone with no time bound next time.
            available_sql = (
                "CASE WHEN t.available_at IN (%s, %s) THEN %s "
                f"WHEN t.available_at = %s OR {charged} THEN %s ELSE %s END"
            )
            available_params = [
                *self._marks(SUSPECT_UNBOUNDED, SUSPECT_CLEARED, SUSPECT_UNBOUNDED),
                *self._marks(SUSPECT_TOGETHER),
                *charged_params,
                *self._marks(SUSPECT, SUSPECT_TOGETHER),
            ]
        # errors comes first, then available_at, then owner: MySQL evaluates single-table SET
        # clauses left to right, and the message, the status, the rescues and the mark read
        # t.owner, t.rescues and t.available_at before they change.
        return (
            f"""
            UPDATE {self.tasks} AS t
            SET errors = {error}, status = {status_sql}, finished_at = {finished_sql}
                {rescues_sql}, available_at = {available_sql}, owner = NULL
            WHERE t.status = 'RUNNING' AND {where}
            """,
            [
                error_class,
                *message_params,
                *status_params,
                *finished_params,
                *rescues_params,
                *available_params,
                *where_params,
            ],
        )
