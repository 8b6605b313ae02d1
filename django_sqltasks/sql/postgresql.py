"""PostgreSQL: batches travel as one JSON document, enqueues and outcomes announce themselves
on the channels of ``channels.py``; its claim, a single statement with SKIP LOCKED, is
``postgresql_claims.py``'s."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.db import InterfaceError, OperationalError
from django.db.backends.utils import CursorWrapper
from orjson import Fragment

from ..core.serialization import dumps, loads
from . import health
from .channels import (
    ANNOUNCE_GIVEN_UP,
    ANNOUNCE_OUTCOMES,
    CHANNEL,
    FINISHED_CHANNEL,
    IDS_PER_NOTIFY,
)
from .dialect import Dialect
from .errors import driver_error
from .postgresql_claims import PostgreSQLClaims
from .probes import PostgreSQLProbe
from .rows import (
    INSERT_COLUMNS,
    NewTask,
    Outcome,
    TableHealth,
    parked_at,
)
from .steps import STEP_COLUMNS, ParkedWait

MIN_VERSION = (13,)
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


class PostgreSQLDialect(PostgreSQLClaims, PostgreSQLProbe, Dialect):
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

    def worker_session_statements(self) -> list[tuple[str, list[Any]]]:
        """Sequential scans off. A prepared claim or outcome write is planned once per
        connection (a generic plan), often when the live partition holds a few rows: a scan
        of one page then costs less than a lookup by TID or by primary key, and the plan
        kept that scan for the connection's life, reading every page of the partition at
        each call, every dead version that a held snapshot keeps among them (49 buffers a
        finish at 120 tasks/s with nothing held). With them off, the planner takes the TID
        and the primary key at any size; a statement with no other path still scans.

        And no JIT compilation. A generic plan's cost comes from the table's statistics: right
        after a held snapshot ended, the claim's rose past ``jit_above_cost`` (121,846 against
        100,000: a partition 36 MB large that holds 500 live rows), and each call then
        compiled 58 functions, 50 ms for a claim that reads 31 buffers, until autovacuum
        shrank the partition (at 400 tasks/s, every claim for 5 s). A scan that has no other
        path, costed as disabled, would take JIT at every call too. None of the worker's
        statements reads enough rows to gain from it."""
        return [("SET enable_seqscan = off", []), ("SET jit = off", [])]

    _db_clock = "now()"  # the statement's (transaction's) start, by the server's clock
    # An enqueue may run late in a long transaction: it is due from its own statement, not
    # from the transaction's start.
    _write_clock = "statement_timestamp()"

    def _ago_sql(self, seconds: float) -> tuple[str, list[Any]]:
        return "now() - make_interval(secs => %s)", [float(seconds)]

    _text_param = "%s::text"

    def _append_error(self, column: str, class_sql: str, traceback_sql: str) -> str:
        return (
            f"{column} || jsonb_build_array(jsonb_build_object("
            f"'exception_class_path', {class_sql}, 'traceback', {traceback_sql}))"
        )

    def _encode_id(self, value: uuid.UUID) -> Any:
        return value

    parks_in_one_statement = True

    def park_at_event(
        self,
        cursor: CursorWrapper,
        *,
        task_id: uuid.UUID,
        owner: str,
        attempt: int,
        claims: int,
        name: str,
        key: str,
        occurrence: int,
        timeout: float | None,
    ) -> ParkedWait | None:
        # One statement in place of the general way's ten (BEGIN, the event row's UPDATE, a
        # savepoint, its INSERT, RELEASE, the clock, the task's UPDATE, the record, COMMIT):
        # each sub-statement sees the same snapshot, and the park and the record are made
        # only where the event's row came back unsent and this task's. The upsert locks the
        # row as the general way's UPDATE does, so a send meets it as before.
        if timeout is None:
            wake, wake_params = "NULL::timestamptz", []
        else:
            wake, wake_params = "statement_timestamp() + make_interval(secs => %s)", [timeout]
        cursor.execute(
            f"WITH event AS ("
            f" INSERT INTO {self.events} AS e (name, key, payload, created_at, sent_at, task_id)"
            f" VALUES (%s, %s, NULL, statement_timestamp(), NULL, %s)"
            f" ON CONFLICT (name, key) DO UPDATE SET task_id = COALESCE(e.task_id, %s)"
            f" RETURNING e.task_id, e.sent_at"
            f"), parked AS ("
            f" UPDATE {self.tasks} AS t SET status = 'READY', owner = NULL,"
            f" available_at = COALESCE({wake}, %s), attempts = t.attempts - 1"
            f" WHERE t.id = %s AND t.status = 'RUNNING' AND t.owner = %s AND t.attempts = %s"
            f" AND jsonb_array_length(t.worker_ids) = %s"
            f" AND EXISTS (SELECT FROM event WHERE event.task_id = %s AND event.sent_at IS NULL)"
            f" RETURNING t.available_at"
            f") INSERT INTO {self.steps} ({', '.join(STEP_COLUMNS)})"
            f" SELECT %s, 'event', %s, %s, 'waiting', 0, NULL, '', %s, {wake},"
            f" statement_timestamp(), NULL FROM parked"
            f" RETURNING id, started_at, wake_at, (SELECT available_at FROM parked)",
            [
                name,
                key,
                task_id,
                task_id,
                *wake_params,
                self._encode_datetime(parked_at()),
                task_id,
                owner,
                attempt,
                claims,
                task_id,
                task_id,
                name,
                occurrence,
                key,
                *wake_params,
            ],
        )
        row = cursor.fetchone()
        if row is None:
            return None
        started_at, until = self._decode_datetime(row[1]), self._decode_datetime(row[3])
        assert started_at is not None and until is not None
        return ParkedWait(
            step_id=row[0],
            started_at=started_at,
            wake_at=self._decode_datetime(row[2]),
            until=until,
        )

    sends_in_two_statements = True

    def mark_event_sent(
        self, cursor: CursorWrapper, *, name: str, key: str, payload: Any
    ) -> tuple[bool, uuid.UUID | None]:
        cursor.execute(
            f"UPDATE {self.events} SET payload = %s::jsonb, sent_at = statement_timestamp()"
            " WHERE name = %s AND key = %s AND sent_at IS NULL RETURNING task_id",
            [None if payload is None else dumps(payload), name, key],
        )
        row = cursor.fetchone()
        return (False, None) if row is None else (True, row[0])

    def wake_waiter(
        self, cursor: CursorWrapper, task_id: uuid.UUID, *, notify: bool
    ) -> tuple[str | None, bool]:
        notified = f", (SELECT count(pg_notify('{CHANNEL}', q)) FROM woken)" if notify else ""
        cursor.execute(
            f"WITH woken AS ("
            f" UPDATE {self.tasks} SET available_at = statement_timestamp()"
            f" WHERE id = %s AND status = 'READY' AND available_at > statement_timestamp()"
            f" RETURNING queue_name AS q"
            f") SELECT (SELECT q FROM woken), EXISTS (SELECT FROM {self.tasks}"
            f" WHERE id = %s AND status IN ('READY', 'RUNNING')){notified}",
            [task_id, task_id],
        )
        queue, live = cursor.fetchone()[:2]
        return queue, bool(live)

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
        lone = self.lone_orphans(cursor, backend_name=backend_name, lease_timeout=lease_timeout)
        if lone is None:  # no task has a lost worker
            return 0
        sql, params = self.requeue_orphans_sql(
            backend_name=backend_name,
            lease_timeout=lease_timeout,
            max_rescues=max_rescues,
            lone=lone,
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
