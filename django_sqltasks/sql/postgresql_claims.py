"""The claim on PostgreSQL: one statement that walks the priorities from their marks, locks the
due tasks with SKIP LOCKED, marks them RUNNING and returns them as one JSON document; the fair
claim's round and the claim of a suspect, each one statement too (``PostgreSQLDialect``'s
claim, ``sql/postgresql.py``)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.db.backends.utils import CursorWrapper

from ..compat import TASK_MIN_PRIORITY
from ..core.serialization import loads
from .claims import claims_commit_relaxed
from .marks import MARK_BASE, NO_MARKS, WALK_START, ClaimFeedback, ClaimMarks, parse_time
from .prepared import PreparedStatements
from .rows import (
    ANY_LIMIT,
    JSON_SHAPES,
    RETURNED_COLUMNS,
    UNLIMITED,
    ClaimedRow,
    Scope,
)
from .suspects import SuspectStatements

RETURNING = ", ".join(f"t.{c}" for c in RETURNED_COLUMNS)
# What a claim writes on each row it takes; parameters: the worker's id twice.
CLAIM_SET = """status = 'RUNNING', owner = %s, attempts = t.attempts + 1,
    worker_ids = t.worker_ids || jsonb_build_array(%s::text),
    started_at = COALESCE(t.started_at, now()), last_attempted_at = now()"""
# The claimed rows' columns in its JSON document. The JSON columns travel as text, decoded row
# by row: one row nested deeper than the decoder allows then fails alone, not its batch.
COLUMNS = ", ".join(f"{c}::text" if c in JSON_SHAPES else c for c in RETURNED_COLUMNS)


class PostgreSQLClaims(PreparedStatements, SuspectStatements):
    """The claim's statements on PostgreSQL."""

    @property
    def _not_in_paused(self) -> str:
        # A per-row lookup in the paused table's unique index, kept a filter of the claim's
        # ordered index scan: OFFSET 0 stops the planner from turning it into an anti-join,
        # and an uncorrelated array (<> ALL) made it estimate one due row and sort them all.
        return (
            f"NOT IN (SELECT p.queue_name FROM {self.paused} p WHERE p.backend_name = %s "
            f"AND p.queue_name = {self.tasks}.queue_name OFFSET 0)"
        )

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
        # One statement (claim_sql) walks the priorities and claims: no walk here.
        sql, params = self.claim_sql(
            backend_name=backend_name,
            queue_names=queue_names,
            worker_id=worker_id,
            limit=limit,
            scope=scope,
            marks=marks.begin() if marks is not None else NO_MARKS,
        )
        try:
            values = self._run_claim(cursor, sql, params)
        except BaseException:
            if marks is not None:
                marks.end(None)
            raise
        if marks is not None:
            marks.end(claim_feedback(values))
        return self.claimed_rows(values[0])

    def claim_sql(
        self,
        *,
        backend_name: str,
        queue_names: list[str] | None,
        worker_id: str,
        limit: int,
        scope: Scope = UNLIMITED,
        marks: tuple[str, str] = NO_MARKS,
    ) -> tuple[str, list[Any]]:
        """The claim statement; ``marks`` (``ClaimMarks.begin()``) says where it starts
        reading each priority, None from the start. Its first value is the claimed rows'
        document (``claimed_rows``); the main claim's next four, what ``claim_feedback``
        reads."""
        where, where_params = self._ready_where(backend_name, queue_names, scope)
        commit = _commit_setting(backend_name)  # constant SQL text, or none
        if scope.priority is not None:
            # The fair claim's, of one priority of one key: one index range, no walk over
            # priorities (whose planning was most of its cost: 9 ms against 0.6 to run).
            return (
                f"""
                WITH picked AS (
                    SELECT id FROM {self.tasks}
                    WHERE {where} AND available_at <= now()
                    ORDER BY available_at
                    LIMIT %s
                    FOR UPDATE SKIP LOCKED
                ), claimed AS (
                    UPDATE {self.tasks} AS t
                    SET {CLAIM_SET}
                    WHERE t.id = ANY (ARRAY(SELECT id FROM picked)) AND t.status = 'READY'
                    RETURNING {RETURNING}
                )
                SELECT json_agg(json_build_array({COLUMNS}))::text{commit}
                FROM claimed
                """,
                [*where_params, limit, worker_id, worker_id],
            )
        prefix, prefix_params = self._ready_prefix(backend_name, queue_names, scope)
        below, starts = marks
        # One statement: the row locks live only as long as this UPDATE; SKIP LOCKED lets
        # concurrent workers take the next rows instead of waiting on these. The recursive
        # CTE walks the priorities that have READY tasks, highest first (sql/marks.py): the
        # next one below p is the nearest with a mark (``below``), or one found between the
        # two by a probe of the ready index, whichever is higher; the due tasks of each are
        # read in turn (LATERAL) from the priority's mark (``starts``), and the walk goes on
        # only while the batch is not full. The rows come back as one JSON document: one
        # value to decode instead of fourteen per row; then the latest available_at taken of
        # each priority, and the statement's snapshot, from which the marks move on.
        # The UPDATE finds the picked rows by their row versions' addresses (ctid, which the
        # row locks keep in place), one TID scan, not by a plan from the table's statistics:
        # a join with ``picked`` was planned, where they were stale (a burst into a table not
        # analyzed since, as after a TRUNCATE or between autovacuum's passes), as a scan of
        # the table per picked id (84 ms a claim of 200 beside 5,000 ready rows, against
        # 3 ms); and a probe of the ids was planned as a scan of the whole partition where a
        # held snapshot had left its id index bloated beside few live rows (its cost is
        # estimated from pages per tuple: 900 buffers a claim, until autovacuum truncated the
        # heap). ``status = 'READY'`` keeps the UPDATE on the partition of live tasks where
        # the table is partitioned. A row another statement updated after this one's
        # snapshot is left READY, for the next claim.
        offset = MARK_BASE - TASK_MIN_PRIORITY
        return (
            f"""
            WITH RECURSIVE marks AS (
                SELECT %s::text::int[] AS below, %s::text::timestamptz[] AS starts
            ), priorities(p) AS (
                SELECT {WALK_START}
                UNION ALL
                SELECT GREATEST(m.below[w.p + {offset}], (
                    SELECT priority FROM {self.tasks}
                    WHERE {prefix} AND priority < w.p
                        AND priority > COALESCE(m.below[w.p + {offset}], {TASK_MIN_PRIORITY - 1})
                    ORDER BY priority DESC LIMIT 1
                ))
                FROM priorities AS w, marks AS m WHERE w.p IS NOT NULL
            ), picked AS (
                SELECT due.ctid FROM priorities CROSS JOIN marks AS m CROSS JOIN LATERAL (
                    SELECT ctid FROM {self.tasks}
                    WHERE {where} AND priority = priorities.p AND available_at <= now()
                        AND available_at >= COALESCE(
                            m.starts[priorities.p + {offset}], '-infinity'::timestamptz)
                    ORDER BY available_at
                    LIMIT %s
                    FOR UPDATE SKIP LOCKED
                ) AS due
                WHERE priorities.p < {WALK_START}
                LIMIT %s
            ), claimed AS (
                UPDATE {self.tasks} AS t
                SET {CLAIM_SET}
                WHERE t.ctid = ANY (ARRAY(SELECT ctid FROM picked)) AND t.status = 'READY'
                RETURNING {RETURNING}, t.available_at AS claimed_at
            )
            SELECT json_agg(json_build_array({COLUMNS}) ORDER BY priority DESC, claimed_at)::text,
                (SELECT json_agg(json_build_array(f.priority, {_utc_text("f.at")}))::text
                    FROM (SELECT priority, max(claimed_at) AS at FROM claimed GROUP BY priority)
                    AS f),
                pg_snapshot_xmin(pg_current_snapshot())::text,
                pg_snapshot_xmax(pg_current_snapshot())::text,
                {_utc_text("statement_timestamp()")}{commit}
            FROM claimed
            """,
            [
                below,
                starts,
                *prefix_params,
                *where_params,
                limit,
                limit,
                worker_id,
                worker_id,
            ],
        )

    def due_priorities_of_keys(
        self,
        cursor: CursorWrapper,
        *,
        backend_name: str,
        queue_names: list[str] | None,
        keys: Sequence[str],
    ) -> list[list[int]]:
        # One statement for the round's keys (each a walk over its priorities, as
        # due_priorities): a statement a key cost a round trip each, which a loaded server
        # made most of a fair claim's time.
        prefix = "status = 'READY' AND limit_key = u.k AND backend_name = %s"
        probe = f"SELECT priority FROM {self.tasks} WHERE {prefix}"
        order = "ORDER BY priority DESC LIMIT 1"
        cursor.execute(
            f"""
            SELECT u.n, d.p FROM unnest(%s::text[]) WITH ORDINALITY AS u(k, n)
            CROSS JOIN LATERAL (
                WITH RECURSIVE priorities(p) AS (
                    SELECT ({probe} {order})
                    UNION ALL
                    SELECT ({probe} AND priority < priorities.p {order})
                    FROM priorities WHERE priorities.p IS NOT NULL
                )
                SELECT p FROM priorities WHERE p IS NOT NULL AND (
                    SELECT available_at FROM {self.tasks} WHERE {prefix} AND priority = priorities.p
                    ORDER BY available_at LIMIT 1
                ) <= now()
            ) AS d
            ORDER BY u.n, d.p DESC
            """,
            [list(keys), backend_name, backend_name, backend_name],
        )
        found: list[list[int]] = [[] for _ in keys]
        for n, priority in cursor.fetchall():
            found[n - 1].append(priority)
        return found

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
        # One statement for every key of the pass: each key's due tasks of ``priority``, one
        # index range each (LATERAL), locked with SKIP LOCKED and claimed together.
        scope = Scope(limit_key=ANY_LIMIT, exclude_queues=exclude_queues)
        where, where_params = self._ready_where(backend_name, queue_names, scope)
        commit = _commit_setting(backend_name)  # constant SQL text, or none
        cursor.execute(
            f"""
            WITH picked AS (
                SELECT due.id FROM unnest(%s::text[], %s::int[]) AS w(k, n)
                CROSS JOIN LATERAL (
                    SELECT id FROM {self.tasks}
                    WHERE {where} AND limit_key = w.k AND priority = %s
                        AND available_at <= now()
                    ORDER BY available_at
                    LIMIT w.n
                    FOR UPDATE SKIP LOCKED
                ) AS due
            ), claimed AS (
                UPDATE {self.tasks} AS t
                SET {CLAIM_SET}
                WHERE t.id = ANY (ARRAY(SELECT id FROM picked)) AND t.status = 'READY'
                RETURNING {RETURNING}, t.limit_key AS claimed_key
            )
            SELECT json_agg(json_build_array({COLUMNS}))::text,
                json_agg(claimed_key)::text{commit}
            FROM claimed
            """,
            [
                [key for key, _ in wants],
                [count for _, count in wants],
                *where_params,
                priority,
                worker_id,
                worker_id,
            ],
        )
        document, keys = cursor.fetchone()[:2]
        by_key: dict[str, list[ClaimedRow]] = {key: [] for key, _ in wants}
        for row, key in zip(self.claimed_rows(document), loads(keys) if keys else [], strict=True):
            by_key[key].append(row)
        return [by_key[key] for key, _ in wants]

    def claim_suspect_by_id(
        self, cursor: CursorWrapper, task_id: uuid.UUID, worker_id: str
    ) -> ClaimedRow | None:
        cursor.execute(
            f"""
            WITH claimed AS (
                UPDATE {self.tasks} AS t
                SET {CLAIM_SET}
                WHERE t.id = %s AND t.status = 'READY' AND t.available_at IN (%s, %s, %s)
                RETURNING {RETURNING}
            )
            SELECT json_agg(json_build_array({COLUMNS}))::text FROM claimed
            """,
            [worker_id, worker_id, task_id, *self._suspect_marks()],
        )
        rows = self._fetch_claimed(cursor)
        return rows[0] if rows else None

    def _run_claim(self, cursor: CursorWrapper, sql: str, params: list[Any]) -> tuple[Any, ...]:
        """Run the claim statement and read its one row (``claim_sql``)."""
        values = self._run_prepared(cursor, sql, params)
        assert values  # json_agg() returns one row, NULL when nothing was claimed
        return tuple(values[0])

    def _fetch_claimed(self, cursor: Any) -> list[ClaimedRow]:
        return self.claimed_rows(cursor.fetchone()[0])

    def claimed_rows(self, document: str | None) -> list[ClaimedRow]:
        """The rows of the claim's one value: its json_agg(), or NULL for no row."""
        if document is None:
            return []
        return [self._claimed_row(values) for values in loads(document)]


def _utc_text(value: str) -> str:
    """SQL for ``value`` (a timestamptz) as ISO 8601 text in UTC with microseconds, which
    ``sql.marks.parse_time`` reads and the claim reads back exactly."""
    return f"""to_char({value} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')"""


def claim_feedback(values: Sequence[Any]) -> ClaimFeedback | None:
    """What the main claim's row (``PostgreSQLDialect.claim_sql``) says besides its rows: the
    latest available_at taken of each priority and its snapshot. None for another claim's."""
    if len(values) < 5 or values[2] is None:
        return None
    taken = {int(p): parse_time(at) for p, at in loads(values[1])} if values[1] else {}
    return ClaimFeedback(
        taken=taken, xmin=int(values[2]), xmax=int(values[3]), at=parse_time(values[4])
    )


def _commit_setting(backend_name: str) -> str:
    """What the claim's SELECT adds when the backend's OPTIONS CLAIM_SYNCHRONOUS_COMMIT is
    False: ``synchronous_commit`` off for the claim's own transaction (``set_config`` with
    is_local, as SET LOCAL), so its commit does not wait for the WAL flush. Enqueues,
    outcomes and requeues keep the session's setting."""
    relaxed = claims_commit_relaxed(backend_name)
    return ", set_config('synchronous_commit', 'off', true)" if relaxed else ""
