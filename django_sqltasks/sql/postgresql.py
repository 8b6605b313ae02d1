"""PostgreSQL: single-statement claim with SKIP LOCKED; batches travel as one JSON document."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.db import InterfaceError, OperationalError
from django.db.backends.utils import CursorWrapper
from orjson import Fragment

from ..compat import TASK_MIN_PRIORITY
from ..core.serialization import dumps, loads
from . import health
from .claims import claims_commit_relaxed
from .dialect import Dialect
from .errors import driver_error
from .marks import MARK_BASE, NO_MARKS, WALK_START, ClaimFeedback, ClaimMarks, parse_time
from .rows import (
    ANY_LIMIT,
    INSERT_COLUMNS,
    JSON_SHAPES,
    RETURNED_COLUMNS,
    UNLIMITED,
    ClaimedRow,
    NewTask,
    Outcome,
    Scope,
    TableHealth,
)

CHANNEL = "sqltasks"  # LISTEN/NOTIFY channel; payload: the queue name of the enqueued task(s)
# The channel of finished tasks, for ``result.wait()``; payload: their ids, comma-separated.
FINISHED_CHANNEL = "sqltasks_finished"
# Ids per notification: 200 ids of 36 characters and their commas are 7,399 bytes, under
# PostgreSQL's payload limit of 8,000.
IDS_PER_NOTIFY = 200
MIN_VERSION = (13,)
RETURNING = ", ".join(f"t.{c}" for c in RETURNED_COLUMNS)
# What a claim writes on each row it takes; parameters: the worker's id twice.
CLAIM_SET = """status = 'RUNNING', owner = %s, attempts = t.attempts + 1,
    worker_ids = t.worker_ids || jsonb_build_array(%s::text),
    started_at = COALESCE(t.started_at, now()), last_attempted_at = now()"""
# The claimed rows' columns in its JSON document. The JSON columns travel as text, decoded row
# by row: one row nested deeper than the decoder allows then fails alone, not its batch.
COLUMNS = ", ".join(f"{c}::text" if c in JSON_SHAPES else c for c in RETURNED_COLUMNS)
# SQLSTATEs that may go away by themselves: serialization failure, deadlock, lock not
# available (lock_timeout), query canceled (statement_timeout), too many connections, the
# server shutting down or starting, and a write in a read-only transaction: a session left on
# a server that takes writes no more (a primary fenced for a switchover, the old writer behind
# a DNS name that moved), which a new connection leaves (target_session_attrs=read-write, or
# the name resolved again). Class 08 (connection exceptions) is matched by prefix.
MISSING_SQLSTATES = frozenset({"42P01", "42703"})  # undefined_table, undefined_column
CONTENTION_SQLSTATES = frozenset({"40001", "40P01", "55P03", "57014"})
TRANSIENT_SQLSTATES = CONTENTION_SQLSTATES | {"53300", "57P01", "57P02", "57P03", "25006"}
# What a multi-row INSERT reads from its JSON document: the columns a new task does not share
# with every other new task, with their types.
INSERT_RECORD = (
    "id uuid, task_path varchar, backend_name varchar, queue_name varchar, priority smallint, "
    "args jsonb, kwargs jsonb, enqueued_at timestamptz, run_after timestamptz, "
    "available_at timestamptz, dedupe_key varchar, limit_key varchar, trace_parent varchar, "
    "workflow_id uuid, tags jsonb"
)


class PostgreSQLDialect(health.PostgreSQLProbe, Dialect):
    product = "PostgreSQL"
    wakeup = "notify"
    estimates_counts = True
    partitions_tasks = True
    indexes_json_values = True
    async_driver = True
    claims_from_marks = True
    _json_placeholder = "%s::jsonb"
    end_session = "pg_terminate_backend()"
    idle_transaction_timeout = "idle_in_transaction_session_timeout"

    def planned_rows(self, cursor: CursorWrapper, sql: str, params: Sequence[Any]) -> int | None:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
        if isinstance(plan, str | bytes):
            plan = loads(plan)
        return int(plan[0]["Plan"]["Plan Rows"])

    def is_transient(self, error: BaseException) -> bool:
        sqlstate = getattr(driver_error(error), "sqlstate", None)
        if sqlstate:
            return sqlstate.startswith("08") or sqlstate in TRANSIENT_SQLSTATES
        # No SQLSTATE: the client lost the server (closed connection, broken socket).
        return isinstance(error, (OperationalError, InterfaceError))

    @staticmethod
    def names_missing_table(error: BaseException) -> bool:
        cause = driver_error(error)
        code = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)  # psycopg 3, 2
        return code in MISSING_SQLSTATES

    def is_contention(self, error: BaseException) -> bool:
        return getattr(driver_error(error), "sqlstate", None) in CONTENTION_SQLSTATES

    def version_problem(self) -> str | None:
        connection = self._current_connection()
        version = divmod(connection.pg_version, 10000)  # type: ignore[attr-defined]
        return self._too_old(version, MIN_VERSION) if version[:1] < MIN_VERSION else None

    def table_health(self, cursor: CursorWrapper) -> TableHealth:
        return health.read_postgresql(cursor, self.tasks)

    listen_sql = f"LISTEN {CHANNEL}"

    def session_statements(self) -> list[tuple[str, list[Any]]]:
        """What Django runs on each new connection (its time zone, and ``OPTIONS
        ["assume_role"]``), for the worker's own connections to run too: a claim's rows carry
        their times as text in the session's time zone, which is read as Django's."""
        statements: list[tuple[str, list[Any]]] = []
        if self.connection.timezone_name:
            statements.append(
                (self.connection.ops.set_time_zone_sql(), [self.connection.timezone_name])
            )
        role = self.connection.settings_dict["OPTIONS"].get("assume_role")
        if role:
            statements.append(("SELECT set_config('role', %s, false)", [role]))
        return statements

    _db_clock = "now()"  # the statement's (transaction's) start, by the server's clock
    # An enqueue may run late in a long transaction: it is due from its own statement, not
    # from the transaction's start.
    _write_clock = "statement_timestamp()"

    def _ago_sql(self, seconds: float) -> tuple[str, list[Any]]:
        return "now() - make_interval(secs => %s)", [float(seconds)]

    @property
    def _not_in_paused(self) -> str:
        # A per-row lookup in the paused table's unique index, kept a filter of the claim's
        # ordered index scan: OFFSET 0 stops the planner from turning it into an anti-join,
        # and an uncorrelated array (<> ALL) made it estimate one due row and sort them all.
        return (
            f"NOT IN (SELECT p.queue_name FROM {self.paused} p WHERE p.backend_name = %s "
            f"AND p.queue_name = {self.tasks}.queue_name OFFSET 0)"
        )

    _text_param = "%s::text"

    def _append_error(self, column: str, class_sql: str, traceback_sql: str) -> str:
        return (
            f"{column} || jsonb_build_array(jsonb_build_object("
            f"'exception_class_path', {class_sql}, 'traceback', {traceback_sql}))"
        )

    def _encode_id(self, value: uuid.UUID) -> Any:
        return value

    def insert_statement(
        self, tasks: Sequence[NewTask], notify: bool = False
    ) -> tuple[str, list[Any]]:
        if len(tasks) == 1:
            sql, params = super().insert_statement(tasks)
        else:
            # One JSON document for the batch: the statement text is the same for any batch
            # size, and encoding it costs far less than fifteen arrays of values.
            sql = (
                f"INSERT INTO {self.tasks} ({', '.join(INSERT_COLUMNS)}) "
                "SELECT id, task_path, backend_name, queue_name, priority, 'READY', args, "
                "kwargs, '[]', '[]', 0, enqueued_at, run_after, "
                f"COALESCE(available_at, run_after, {self._write_clock}), dedupe_key, limit_key, "
                "trace_parent, workflow_id, tags "
                f"FROM jsonb_to_recordset(%s::jsonb) AS v({INSERT_RECORD})"
            )
            params = [_insert_document(tasks)]
        if notify:
            # One round trip: the notification rides on the INSERT and, like the rows, is
            # delivered at commit (or never, on rollback). One per distinct queue.
            sql = (
                f"WITH inserted AS ({sql} RETURNING queue_name) "
                f"SELECT pg_notify('{CHANNEL}', q) FROM (SELECT DISTINCT queue_name AS q "
                "FROM inserted) AS queues"
            )
        return sql, params

    def insert(self, cursor: CursorWrapper, tasks: Sequence[NewTask], notify: bool = False) -> None:
        # Prepared where the project allows it (_run_prepared): an enqueue's text is the same
        # for every batch of one size (one JSON document beyond one row), planned once.
        sql, params = self.insert_statement(tasks, notify)
        self._run_prepared(cursor, sql, params, fetch=False)

    def insert_deduplicated(self, cursor: CursorWrapper, task: NewTask, notify: bool) -> bool:
        sql, params = super().insert_statement([task])
        returning = f", pg_notify('{CHANNEL}', queue_name)" if notify else ""
        cursor.execute(
            f"WITH inserted AS ({sql} ON CONFLICT DO NOTHING RETURNING id, queue_name) "
            f"SELECT id{returning} FROM inserted",
            params,
        )
        return cursor.fetchone() is not None

    def bulk_insert(
        self, cursor: CursorWrapper, tasks: Sequence[NewTask], notify: bool = False
    ) -> None:
        raw = cursor.cursor
        if not hasattr(raw, "copy"):  # psycopg2: multi-row INSERTs
            super().bulk_insert(cursor, tasks, notify=notify)
            return
        # COPY is several times faster than INSERT for thousands of rows. It takes values,
        # not SQL: a task without run_after is due at the server's time, read first.
        due = INSERT_COLUMNS.index("available_at")
        now = None
        if any(task.run_after is None and task.available_at is None for task in tasks):
            cursor.execute(f"SELECT {self._write_clock}")
            now = cursor.fetchone()[0]
        with raw.copy(f"COPY {self.tasks} ({', '.join(INSERT_COLUMNS)}) FROM STDIN") as copy:
            for task in tasks:
                params = self._insert_params(task)
                if task.run_after is None and task.available_at is None:
                    params[due] = now
                copy.write_row(params)
        if notify:
            queues = sorted({task.queue_name for task in tasks})
            cursor.execute(
                f"SELECT pg_notify('{CHANNEL}', q) FROM unnest(%s::text[]) AS q", [queues]
            )

    def announce(self, cursor: CursorWrapper, queue_names: Sequence[str]) -> None:
        cursor.execute(
            f"SELECT pg_notify('{CHANNEL}', q) FROM unnest(%s::text[]) AS q", [list(queue_names)]
        )

    listen_finished_sql = f"LISTEN {FINISHED_CHANNEL}"

    def finished_among(self, cursor: CursorWrapper, task_ids: Sequence[uuid.UUID]) -> set[str]:
        if not task_ids:
            return set()
        cursor.execute(
            f"SELECT id::text FROM {self.tasks} WHERE id = ANY(%s::uuid[]) "
            "AND status IN ('SUCCESSFUL', 'FAILED')",
            [[str(task_id) for task_id in task_ids]],
        )
        return {row[0] for row in cursor.fetchall()}

    def announce_finished(self, cursor: CursorWrapper, task_ids: Sequence[uuid.UUID]) -> None:
        ids = [str(task_id) for task_id in task_ids]
        payloads = [
            ",".join(ids[i : i + IDS_PER_NOTIFY]) for i in range(0, len(ids), IDS_PER_NOTIFY)
        ]
        cursor.execute(
            f"SELECT pg_notify('{FINISHED_CHANNEL}', p) FROM unnest(%s::text[]) AS p", [payloads]
        )

    def requeue_orphans(
        self,
        cursor: CursorWrapper,
        *,
        backend_name: str,
        lease_timeout: float,
        max_rescues: int | None = None,
    ) -> int:
        sql, params = self.requeue_orphans_sql(
            backend_name=backend_name, lease_timeout=lease_timeout, max_rescues=max_rescues
        )
        if max_rescues is None:  # every task goes back to READY: none finishes here
            cursor.execute(sql, params)
            return cursor.rowcount
        # The tasks that used up their rescues fail here: their waiters are told at once.
        cursor.execute(
            f"""
            WITH done AS ({sql} RETURNING t.id, t.status),
            told AS ({ANNOUNCE_GIVEN_UP})
            SELECT count(*) FROM done, told
            """,
            params,
        )
        row = cursor.fetchone()
        return int(row[0]) if row else 0

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

    def _run_prepared(
        self, cursor: CursorWrapper, sql: str, params: list[Any], fetch: bool = True
    ) -> list[Any]:
        """Run one of the statements every task costs (its enqueue, a claim, an outcome
        batch) and read its rows (none unless ``fetch``): as a prepared statement where the
        project allows them, planned once per connection instead of at each call (planning a
        statement over the partitioned table costs about as much as running it). Django's
        cursors bind parameters on the client, and are never prepared."""
        raw: Any = getattr(cursor.cursor, "connection", None)
        if not _can_prepare(raw):
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if fetch else []
        import psycopg  # optional dependency (postgres extra)

        with self.connection.wrap_database_errors, psycopg.Cursor(raw) as prepared:
            prepared.execute(sql, params, prepare=True)
            return prepared.fetchall() if fetch else []

    def _fetch_claimed(self, cursor: Any) -> list[ClaimedRow]:
        return self.claimed_rows(cursor.fetchone()[0])

    def claimed_rows(self, document: str | None) -> list[ClaimedRow]:
        """The rows of the claim's one value: its json_agg(), or NULL for no row."""
        if document is None:
            return []
        return [self._claimed_row(values) for values in loads(document)]

    def complete(
        self, cursor: CursorWrapper, worker_id: str, outcomes: Sequence[Outcome]
    ) -> set[uuid.UUID]:
        error = self._append_error("t.errors", "v.error_class", "v.error_traceback")
        # The outcomes travel as one JSON document (cheaper to encode than seven arrays). The
        # owner guard keeps a late result from overwriting a task that was rescued and claimed
        # again (or finished) meanwhile; the attempt guard, one claimed again by another
        # process under the same worker id.
        # Each row is found by its id in the primary key (RUNNING_BY_ID), never by reading
        # every RUNNING entry of sqltasks_running_idx, which a held snapshot fills with dead
        # ones (741 buffers a call where the key reads a few).
        # The ids reach the planner unseen (IDS_UNSEEN), so that a prepared statement's plan
        # is made once, not at each call (planning costs three times what running it does).
        # Finished tasks are announced in the same statement, one NOTIFY per IDS_PER_NOTIFY
        # of them, for the processes waiting on them (``result.wait()``); the cross join with
        # ``told`` (always one row) makes it run.
        rows = self._run_prepared(
            cursor,
            f"""
            WITH done AS (
                UPDATE {self.tasks} AS t
                SET status = v.status, finished_at = v.finished_at, owner = NULL,
                    return_value = v.return_value::jsonb,
                    errors = CASE WHEN v.error_class IS NULL THEN t.errors ELSE {error} END,
                    available_at = COALESCE(
                        v.available_at,
                        {self._write_clock} + make_interval(secs => v.delay),
                        t.available_at
                    ),
                    attempts = t.attempts - v.snoozed, snoozes = t.snoozes + v.snoozed
                FROM jsonb_to_recordset(%s::jsonb) AS v(
                    id uuid, status text, finished_at timestamptz, return_value text,
                    error_class text, error_traceback text, available_at timestamptz, snoozed int,
                    delay float8, attempt int
                )
                WHERE t.id = ANY({IDS_UNSEEN}) AND t.id = v.id AND {RUNNING_BY_ID}
                    AND t.owner = %s AND (v.attempt IS NULL OR t.attempts = v.attempt)
                RETURNING t.id, t.status
            ), told AS ({ANNOUNCE_OUTCOMES})
            SELECT done.id FROM done, told
            """,
            [
                _outcomes_document(outcomes),
                [str(outcome.id) for outcome in outcomes],
                worker_id,
            ],
        )
        return {self._decode_id(values[0]) for values in rows}


# The condition that a row of ``t`` is RUNNING, written so that no partial index can serve it:
# ``status IN ('READY', 'RUNNING')`` keeps only the live partition, and implies neither
# sqltasks_running_idx's predicate nor the ready indexes', so the planner, whatever it
# estimates (a prepared statement's generic plan guesses ten ids and few RUNNING rows), finds
# the rows by id. Values are stored in capitals: upper() changes none.
RUNNING_BY_ID = "t.status IN ('READY', 'RUNNING') AND upper(t.status) = 'RUNNING'"


# An array of ids as a query's parameter that the planner cannot read, even in a custom plan
# (an InitPlan): its estimates are then the same for every call, ten ids, and a prepared
# statement's plan cache keeps the generic plan after its five custom ones. Given as a
# constant, one id made each custom plan look cheaper than the generic plan for ten, and the
# statement was planned again at every call (0.8 ms of the server's CPU per call).
IDS_UNSEEN = "(SELECT %s::uuid[])::uuid[]"


def _announce_finished_sql(rows: str, where: str) -> str:
    """A query that sends the ids of ``rows`` (a CTE with ``id`` and ``status``) matching
    ``where`` on FINISHED_CHANNEL, IDS_PER_NOTIFY to a notification. It yields one row (how
    many it sent), so a statement that joins it as a CTE always runs it."""
    return f"""
        SELECT count(pg_notify('{FINISHED_CHANNEL}', g.ids)) FROM (
            SELECT string_agg(f.id::text, ',') AS ids FROM (
                SELECT id, row_number() OVER () AS n FROM {rows} WHERE {where}
            ) AS f
            GROUP BY (f.n - 1) / {IDS_PER_NOTIFY}
        ) AS g
    """


# Fixed SQL text: the tasks an outcome batch finished (not those it sent back to READY), and
# the tasks a rescue failed out of rescues, each as the CTE ``done`` returns them.
ANNOUNCE_OUTCOMES = _announce_finished_sql("done", "status <> 'READY'")
ANNOUNCE_GIVEN_UP = _announce_finished_sql("done", "status = 'FAILED'")


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


def _can_prepare(raw: Any) -> bool:
    """Whether ``raw`` is a psycopg 3 connection that may hold prepared statements: only when
    the project turned them on (``OPTIONS["prepare_threshold"]`` a number; Django's default,
    None, leaves them off so that poolers in transaction mode keep working)."""
    try:
        import psycopg  # optional dependency (postgres extra)
    except ImportError:  # psycopg2
        return False
    return isinstance(raw, psycopg.Connection) and raw.prepare_threshold is not None


def _insert_document(tasks: Sequence[NewTask]) -> str:
    """The JSON document a multi-row INSERT reads its rows from (INSERT_RECORD)."""
    return dumps(
        [
            {
                "id": task.id,
                "task_path": task.task_path,
                "backend_name": task.backend_name,
                "queue_name": task.queue_name,
                "priority": task.priority,
                "args": Fragment(task.args_json or dumps(task.args)),
                "kwargs": Fragment(task.kwargs_json or dumps(task.kwargs)),
                "enqueued_at": task.enqueued_at,
                "run_after": task.run_after,
                "available_at": task.available_at,
                "dedupe_key": task.dedupe_key,
                "limit_key": task.limit_key,
                "trace_parent": task.trace_parent,
                "workflow_id": task.workflow_id,
                "tags": list(task.tags) if task.tags else None,
            }
            for task in tasks
        ]
    )


def _outcomes_document(outcomes: Sequence[Outcome]) -> str:
    """The JSON document a completion reads its outcomes from."""
    return dumps(
        [
            {
                "id": o.id,
                "status": o.status,
                "finished_at": o.finished_at,
                "return_value": o.return_value,
                "error_class": o.error_class,
                "error_traceback": o.error_traceback,
                "available_at": o.available_at,
                "snoozed": o.snoozed,
                "delay": o.delay,
                "attempt": o.attempt,
            }
            for o in outcomes
        ]
    )
