"""What every SQL dialect provides: the facts about its database and the statements on the
task, worker and paused-queue tables, run on a Django connection's cursor."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import InterfaceError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.utils import timezone as dj_timezone

from ..compat import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY
from ..core.serialization import dumps
from ..core.storable import storable
from .rows import (
    ANY_LIMIT,
    INSERT_COLUMNS,
    OUTCOME_NOT_STORED,
    UNLIMITED,
    UTC,
    WORKER_LOST,
    WORKER_STOPPED,
    ClaimedRow,
    NewTask,
    Outcome,
    Scope,
    TableHealth,
    json_column,
    parked_at,
    suspect_at,
)

SUSPECT_CANDIDATES = 8  # suspects read per claim_suspect: the next ones if others took the first
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
    "queue, to run alone next time."
)
# The end of that error instead, when the task has used up its rescues (MAX_RESCUES).
ORPHAN_GIVE_UP = (
    " stopped heartbeating while running this task; it had been put back in the queue {n} "
    "time(s) after losing its worker (MAX_RESCUES is {n}), so it failed."
)


def driver_error(error: BaseException) -> BaseException:
    """The database driver's exception behind Django's wrapper (or ``error`` itself)."""
    cause = error.__cause__
    return cause if cause is not None else error


class Dialect:
    """Raw SQL for one database vendor, run on a Django connection's cursor, and the facts
    about that database that the rest of the package acts on."""

    # Facts ------------------------------------------------------------------------------

    product = "database"
    # How a worker learns of new tasks: "notify" (LISTEN/NOTIFY), "files" (watching the
    # database's files), or "poll" (only its claims).
    wakeup = "poll"
    # Whether the database takes one writer at a time (then a worker writes its outcomes on
    # the connection it claims with, instead of a second one that would wait for the first).
    single_writer = False
    # Whether the planner's row estimate is cheap to read (the admin uses it for large counts).
    estimates_counts = False
    # How an operator ends another session, and the setting that ends a forgotten
    # transaction by itself (named in the warning of an old transaction).
    end_session = "KILL"
    idle_transaction_timeout = "idle_transaction_timeout (MariaDB)"
    # Whether aenqueue() talks to the database natively from the event loop (psycopg 3's
    # async connections), rather than through a thread.
    async_driver = False

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        from ..models import PausedQueue, TaskRecord, WorkerRecord

        self.connection = connection
        qn = connection.ops.quote_name
        self.tasks = qn(TaskRecord._meta.db_table)
        self.workers = qn(WorkerRecord._meta.db_table)
        self.paused = qn(PausedQueue._meta.db_table)
        self.use_tz = settings.USE_TZ

    def is_transient(self, error: BaseException) -> bool:
        """Whether ``error`` may go away by itself (a lost connection, a server restart, a
        deadlock, a lock timeout), so that the same statement may succeed if run again.
        Anything else (a value the database refuses, a statement it cannot run) is not."""
        return isinstance(error, InterfaceError)

    @staticmethod
    def names_missing_table(error: BaseException) -> bool:
        """Whether ``error`` (Django's or the driver's) says a table or column does not exist:
        what a missing migration looks like on this database."""
        return False

    def is_contention(self, error: BaseException) -> bool:
        """Whether ``error`` is a transient error caused by other transactions (a lock wait
        timeout, a deadlock, a serialization failure, a busy database file): never the fault
        of the statement that met it, so it is waited out, not judged."""
        return False

    def version_problem(self) -> str | None:
        """Say which version is needed if the server is too old for django-sqltasks."""
        return None

    def location(self) -> str:
        """Where the database is, for people: its host and port."""
        settings_dict = self.connection.settings_dict
        host = settings_dict.get("HOST") or "localhost"
        return f"{host}:{settings_dict['PORT']}" if settings_dict.get("PORT") else host

    def max_statement_bytes(self) -> int | None:
        """The largest statement the server accepts, in bytes, if it has a limit to heed."""
        return None

    def outcome_problem(self, outcome: Outcome) -> str | None:
        """Say why ``outcome`` cannot be written as it is (too large for one statement, say),
        before trying; None if nothing is known against it."""
        return None

    def current_connection(self) -> BaseDatabaseWrapper:
        """This dialect's connection for the calling thread (a dialect is shared by all)."""
        from django.db import connections

        return connections[self.connection.alias]

    def session_statements(self) -> list[tuple[str, list[Any]]]:
        """Statements to run on a new connection of our own that Django would run on its own
        (none, on most databases)."""
        return []

    def table_health(self, cursor: CursorWrapper) -> TableHealth:
        """Read whether old row versions of the task table can be cleaned up, and what holds
        them back: autovacuum, dead rows, old transactions of other sessions."""
        return TableHealth()

    # The clock -----------------------------------------------------------------------------
    # Leases, rescues, claims and periodic slots compare times written by different machines:
    # they all read the database's clock, so that a worker whose own clock is off can neither
    # rescue live tasks nor start deferred ones early. SQLite is one machine's database: there
    # the process's clock is the database's.

    db_clock: str | None = None  # SQL for the database's current time; None: this process's
    # SQL for the database's time at the start of a statement: what an enqueue without
    # run_after is due at, and what a retry's or a snooze's delay counts from. None: this
    # process's (then db_clock is None too).
    write_clock: str | None = None

    def now_sql(self) -> tuple[str, list[Any]]:
        """SQL (and its parameters) for the current time, by the database's clock."""
        if self.db_clock is not None:
            return self.db_clock, []
        return "%s", [self.encode_datetime(dj_timezone.now())]

    def ago_sql(self, seconds: float) -> tuple[str, list[Any]]:
        """SQL (and its parameters) for the time ``seconds`` ago, by the database's clock."""
        return "%s", [self.encode_datetime(dj_timezone.now() - timedelta(seconds=seconds))]

    def db_now(self, cursor: CursorWrapper) -> datetime:
        """The database's current time (an aware datetime with USE_TZ, as Django reads it)."""
        sql, params = self.now_sql()
        if self.db_clock is None:
            return dj_timezone.now()
        cursor.execute(f"SELECT {sql}", params)
        value = self.decode_datetime(cursor.fetchone()[0])
        assert value is not None
        return value

    def too_old(self, version: Sequence[int], needed: Sequence[int]) -> str:
        have = ".".join(map(str, version[: len(needed) + 1]))
        need = ".".join(map(str, needed))
        return (
            f"Database {self.connection.alias!r} runs {self.product} {have}; django-sqltasks "
            f"needs {self.product} {need} or newer."
        )

    # Values in and out ------------------------------------------------------------------

    def encode_id(self, value: uuid.UUID) -> Any:
        return value.hex

    def decode_id(self, value: Any) -> uuid.UUID:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(value)

    def encode_datetime(self, value: datetime | None) -> Any:
        return self.connection.ops.adapt_datetimefield_value(value)

    def decode_datetime(self, value: Any) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC) if self.use_tz else value
        # Text from the database is in the connection's time zone, which without USE_TZ is
        # TIME_ZONE: the naive local time Django would return.
        return value if self.use_tz else value.replace(tzinfo=None)

    def outcome_params(self, outcome: Outcome) -> list[Any]:
        """An outcome's values in the order of OUTCOME_COLUMNS. Where this process's clock is
        the database's (``write_clock`` None), a delay is made a time here."""
        available_at, delay = outcome.available_at, outcome.delay
        if self.write_clock is None and delay is not None:
            available_at = available_at or dj_timezone.now() + timedelta(seconds=delay)
            delay = None
        return [
            self.encode_id(outcome.id),
            outcome.status,
            self.encode_datetime(outcome.finished_at),
            outcome.return_value,
            outcome.error_class,
            outcome.error_traceback,
            self.encode_datetime(available_at),
            outcome.snoozed,
            delay,
        ]

    def claimed_row(self, values: Sequence[Any], *, json_decoded: bool = False) -> ClaimedRow:
        """A claimed row from its RETURNED_COLUMNS values; ``json_decoded`` when the JSON
        columns arrive as Python values rather than text."""
        (
            id_,
            task_path,
            backend_name,
            queue_name,
            priority,
            args,
            kwargs,
            enqueued_at,
            run_after,
            started_at,
            last_attempted_at,
            errors,
            worker_ids,
            attempts,
            snoozes,
            workflow_id,
            trace_parent,
        ) = values  # fmt: skip  (RETURNED_COLUMNS, in order)
        # A row damaged outside this package must fail alone, not break the whole claim.
        problems: list[str] = []
        decode_json = partial(json_column, decoded=json_decoded, problems=problems)
        decode = partial(self._decode_datetime, problems=problems)
        return ClaimedRow(
            id=self.decode_id(id_),
            task_path=task_path,
            backend_name=backend_name,
            queue_name=queue_name,
            priority=priority,
            args=decode_json("args", args),
            kwargs=decode_json("kwargs", kwargs),
            enqueued_at=decode(enqueued_at),  # type: ignore[arg-type]
            run_after=decode(run_after),
            started_at=decode(started_at),  # type: ignore[arg-type]
            last_attempted_at=decode(last_attempted_at),  # type: ignore[arg-type]
            errors=decode_json("errors", errors),
            worker_ids=decode_json("worker_ids", worker_ids),
            attempts=attempts,
            snoozes=snoozes,
            workflow_id=None if workflow_id is None else self.decode_id(workflow_id),
            corrupt="; ".join(problems) or None,
            trace_parent=trace_parent,
        )

    def _decode_datetime(self, value: Any, *, problems: list[str]) -> datetime | None:
        try:
            return self.decode_datetime(value)
        except (TypeError, ValueError) as e:
            problems.append(f"a date column holds {str(value)[:100]!r} ({e})")
            return datetime.now(UTC)

    def fetch_claimed(self, cursor: CursorWrapper) -> list[ClaimedRow]:
        """The rows the claim statement just returned."""
        return [self.claimed_row(values) for values in cursor.fetchall()]

    def insert_params(self, task: NewTask) -> list[Any]:
        return [
            self.encode_id(task.id),
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
            self.encode_datetime(task.enqueued_at),
            self.encode_datetime(task.run_after),
            # With a clock of its own, the database fills in when a task without run_after
            # is due (see insert_sql): the enqueuing machine's clock may be off.
            self.encode_datetime(
                task.run_after if self.write_clock else task.run_after or task.enqueued_at
            ),
            task.dedupe_key,
            task.limit_key,
            task.trace_parent,
        ]

    # Statements --------------------------------------------------------------------------

    json_placeholder = "%s"

    explain_prefix = "EXPLAIN"  # how to ask the planner for a statement's plan

    def explain(self, cursor: CursorWrapper, sql: str, params: Sequence[Any]) -> str:
        """The planner's plan for ``sql`` as text (the statement is not run)."""
        cursor.execute(f"{self.explain_prefix} {sql}", params)
        return "\n".join(" ".join(str(value) for value in row) for row in cursor.fetchall())

    def ping(self, cursor: CursorWrapper) -> None:
        """Run the cheapest statement: whether the database answers at all."""
        cursor.execute("SELECT 1")
        cursor.fetchone()

    def select_result_sql(self, columns: Sequence[str]) -> str:
        """A statement reading one task's ``columns`` by id and backend name."""
        return f"SELECT {', '.join(columns)} FROM {self.tasks} WHERE id = %s AND backend_name = %s"

    def insert_sql(self, count: int) -> str:
        j = self.json_placeholder
        due = f"COALESCE(%s, {self.write_clock})" if self.write_clock else "%s"
        row = f"(%s, %s, %s, %s, %s, %s, {j}, {j}, {j}, {j}, %s, %s, %s, {due}, %s, %s, %s)"
        return f"INSERT INTO {self.tasks} ({', '.join(INSERT_COLUMNS)}) VALUES " + ", ".join(
            [row] * count
        )

    def insert_statement(
        self, tasks: Sequence[NewTask], notify: bool = False
    ) -> tuple[str, list[Any]]:
        """One multi-row INSERT of ``tasks``; ``notify`` wakes listening workers."""
        params: list[Any] = []
        for task in tasks:
            params.extend(self.insert_params(task))
        return self.insert_sql(len(tasks)), params

    def insert(self, cursor: CursorWrapper, tasks: Sequence[NewTask], notify: bool = False) -> None:
        """Insert ``tasks`` in one statement, on the caller's connection and transaction."""
        cursor.execute(*self.insert_statement(tasks, notify))

    bulk_chunk = 1000  # rows per INSERT: under SQLite's 32,766-parameter limit at 17 per row

    def insert_deduplicated(self, cursor: CursorWrapper, task: NewTask, notify: bool) -> bool:
        """Insert ``task`` unless a live task has its dedupe key; return whether it did."""
        sql, params = self.insert_statement([task])
        cursor.execute(f"{sql} ON CONFLICT DO NOTHING RETURNING id", params)
        return cursor.fetchone() is not None

    def live_task_with_key(self, cursor: CursorWrapper, dedupe_key: str) -> uuid.UUID | None:
        """The id of the READY or RUNNING task holding ``dedupe_key``, if any."""
        cursor.execute(
            f"SELECT id FROM {self.tasks} WHERE dedupe_key = %s AND status IN ('READY', 'RUNNING')",
            [dedupe_key],
        )
        row = cursor.fetchone()
        return None if row is None else self.decode_id(row[0])

    def bulk_insert(
        self, cursor: CursorWrapper, tasks: Sequence[NewTask], notify: bool = False
    ) -> None:
        """Insert many ``tasks`` on the caller's connection, in as few statements as allowed."""
        for start in range(0, len(tasks), self.bulk_chunk):
            self.insert(cursor, tasks[start : start + self.bulk_chunk], notify=notify)

    def claim_sql(
        self,
        *,
        backend_name: str,
        queue_names: list[str] | None,
        worker_id: str,
        limit: int,
        scope: Scope = UNLIMITED,
    ) -> tuple[str, list[Any]]:
        """The statement that claims (or, on MySQL, locks) up to ``limit`` due tasks: those
        whose ``available_at`` has come by the database's clock."""
        raise NotImplementedError

    def claim(
        self,
        cursor: CursorWrapper,
        *,
        backend_name: str,
        queue_names: list[str] | None,
        worker_id: str,
        limit: int,
        scope: Scope = UNLIMITED,
    ) -> list[ClaimedRow]:
        """Mark up to ``limit`` due tasks RUNNING for ``worker_id`` and return them."""
        sql, params = self.claim_sql(
            backend_name=backend_name,
            queue_names=queue_names,
            worker_id=worker_id,
            limit=limit,
            scope=scope,
        )
        return self.run_claim(cursor, sql, params)

    def run_claim(self, cursor: CursorWrapper, sql: str, params: list[Any]) -> list[ClaimedRow]:
        """Run the claim statement and read the rows it claimed."""
        cursor.execute(sql, params)
        return self.fetch_claimed(cursor)

    def ready_where(
        self, backend_name: str, queue_names: list[str] | None, scope: Scope
    ) -> tuple[str, list[Any]]:
        """The claim's conditions besides the due time and the priority: READY, of this
        backend, in the ``scope``'s limit key and queues, not paused. Each form is served by a
        ready index."""
        queue_sql, queue_params = self.queue_filter(queue_names, backend_name)
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
        return " AND limit_key = %s", [scope.limit_key]

    def ready_prefix(
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
    def ready_index(queue_names: list[str] | None, scope: Scope) -> str | None:
        """The ready index that ``ready_prefix`` leads (None for ``ANY_LIMIT``: no one index)."""
        if scope.limit_key is ANY_LIMIT:
            return None
        if scope.limit_key is not None:
            return "sqltasks_ready_limited_idx"
        if queue_names is not None and len(queue_names) == 1:
            return "sqltasks_ready_idx"
        return "sqltasks_ready_all_idx"

    def priorities_sql(
        self, backend_name: str, queue_names: list[str] | None, scope: Scope
    ) -> tuple[str, list[Any]]:
        """A recursive CTE, ``priorities(p)``: the priorities of the READY tasks a claim may
        take, highest first, then one NULL; one probe of the ready index each, however many
        tasks each has. A claim that takes the due tasks of one priority at a time, from the
        index range that ends at the current time, reads no task that is not due; in the one
        range ``priority DESC, available_at``, every deferred task of a higher priority came
        before the first due task of a lower one."""
        prefix, params = self.ready_prefix(backend_name, queue_names, scope)
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

    def due_priorities_sql(
        self, backend_name: str, queue_names: list[str] | None, scope: Scope = UNLIMITED
    ) -> tuple[str, list[Any]]:
        """The priorities, highest first, that have a due READY task a claim may take: the
        earliest task of each priority in ``priorities_sql`` is due (one probe each)."""
        prefix, prefix_params = self.ready_prefix(backend_name, queue_names, scope)
        priorities, priority_params = self.priorities_sql(backend_name, queue_names, scope)
        now, now_params = self.now_sql()
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
        cursor.execute(
            f"UPDATE {self.tasks} SET status = 'FAILED', finished_at = %s, owner = NULL, "
            f"return_value = NULL, errors = {self.json_placeholder} "
            "WHERE id = %s AND status = 'RUNNING' AND owner = %s",
            [
                self.encode_datetime(
                    outcome.finished_at or outcome.available_at or dj_timezone.now()
                ),
                error,
                self.encode_id(outcome.id),
                worker_id,
            ],
        )
        return {outcome.id} if cursor.rowcount else set()

    # Pieces of SQL that differ by vendor, used by the shared statements below.
    text_param = "%s"

    def append_error(self, column: str, class_sql: str, traceback_sql: str) -> str:
        """SQL for ``column`` (a JSON list) with one {exception_class_path, traceback} appended."""
        raise NotImplementedError

    def concat(self, *parts: str) -> str:
        return " || ".join(parts)

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
        others of no limit suspects (see SUSPECT)."""
        error = self.append_error("t.errors", self.text_param, message_sql)
        now, now_params = self.now_sql()
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
        available_sql, available_params = now, list(now_params)
        if rescue is not None:
            charged, charged_params = rescue
            rescues_sql = f", rescues = t.rescues + CASE WHEN {charged} THEN 1 ELSE 0 END"
            rescues_params = list(charged_params)
            # Tasks under a limit go back by the clock: the limited claim, which keeps their
            # limit, takes them (they are charged at each rescue instead).
            available_sql = f"CASE WHEN t.limit_key IS NULL THEN %s ELSE {now} END"
            available_params = [self.encode_datetime(suspect_at()), *now_params]
        # errors comes first and available_at last: MySQL evaluates single-table SET clauses
        # left to right, and the message, the status and the rescues read t.owner, t.rescues
        # and t.available_at before they change.
        return (
            f"""
            UPDATE {self.tasks} AS t
            SET errors = {error}, status = {status_sql}, finished_at = {finished_sql}
                {rescues_sql}, owner = NULL, available_at = {available_sql}
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

    def requeue_orphans(
        self,
        cursor: CursorWrapper,
        *,
        backend_name: str,
        lease_timeout: float,
        max_rescues: int | None = None,
    ) -> int:
        """Put RUNNING tasks whose owner has not heartbeaten for ``lease_timeout`` seconds (by
        the database's clock) back in the queue. A task that ran alone (a suspect) or under a
        limit is charged a rescue, and fails once it was rescued ``max_rescues`` times already
        (a task that kills its worker); the others become suspects, each to run alone."""
        cursor.execute(
            *self.requeue_orphans_sql(
                backend_name=backend_name, lease_timeout=lease_timeout, max_rescues=max_rescues
            )
        )
        return cursor.rowcount

    def requeue_orphans_sql(
        self,
        *,
        backend_name: str,
        lease_timeout: float,
        max_rescues: int | None = None,
    ) -> tuple[str, list[Any]]:
        """The rescue statement (see ``requeue_orphans``)."""
        owner = "COALESCE(t.owner, '(none)')"
        charged = "(t.available_at = %s OR t.limit_key IS NOT NULL)"
        charged_params = [self.encode_datetime(suspect_at())]
        p = self.text_param
        ends = f"CASE WHEN {charged} THEN {p} ELSE {p} END"
        ends_params = [*charged_params, ORPHAN_MESSAGE[1], ORPHAN_SUSPECT]
        if max_rescues is None:
            message_sql = self.concat(p, owner, ends)
            message_params: list[Any] = [ORPHAN_MESSAGE[0], *ends_params]
            fail_when = None
        else:
            given_up = f"{charged} AND t.rescues >= %s"
            given_up_params = [*charged_params, max_rescues]
            message_sql = self.concat(p, owner, f"CASE WHEN {given_up} THEN {p} ELSE {ends} END")
            message_params = [
                ORPHAN_MESSAGE[0],
                *given_up_params,
                ORPHAN_GIVE_UP.format(n=max_rescues),
                *ends_params,
            ]
            fail_when = (given_up, given_up_params)
        live_since, live_params = self.ago_sql(lease_timeout)
        return self._requeue_sql(
            where=(
                f"t.backend_name = %s AND (t.owner IS NULL OR NOT EXISTS (SELECT 1 FROM "
                f"{self.workers} w WHERE w.id = t.owner AND w.heartbeat_at >= {live_since}))"
            ),
            where_params=[backend_name, *live_params],
            error_class=WORKER_LOST,
            message_sql=message_sql,
            message_params=message_params,
            fail_when=fail_when,
            rescue=(charged, charged_params),
        )

    # Suspects -------------------------------------------------------------------------------

    def suspects_sql(
        self, backend_name: str, queue_names: list[str] | None, limit: int
    ) -> tuple[str, list[Any]]:
        """The ids of up to ``limit`` suspects a worker on ``queue_names`` may take, best
        first. One probe of the ready index per priority: suspects are few."""
        where, params = self.ready_where(backend_name, queue_names, UNLIMITED)
        priorities = list(range(TASK_MAX_PRIORITY, TASK_MIN_PRIORITY - 1, -1))
        marks = ", ".join(["%s"] * len(priorities))
        return (
            f"SELECT id FROM {self.tasks} WHERE {where} AND priority IN ({marks}) "
            f"AND available_at = %s ORDER BY priority DESC, id LIMIT %s",
            [*params, *priorities, self.encode_datetime(suspect_at()), limit],
        )

    def suspects_waiting(
        self, cursor: CursorWrapper, *, backend_name: str, queue_names: list[str] | None
    ) -> bool:
        """Whether a suspect waits that a worker on ``queue_names`` may take."""
        cursor.execute(*self.suspects_sql(backend_name, queue_names, 1))
        return cursor.fetchone() is not None

    def claim_suspect(
        self,
        cursor: CursorWrapper,
        *,
        backend_name: str,
        queue_names: list[str] | None,
        worker_id: str,
    ) -> ClaimedRow | None:
        """Claim one suspect for ``worker_id``, which runs it alone (None if none waits)."""
        cursor.execute(*self.suspects_sql(backend_name, queue_names, SUSPECT_CANDIDATES))
        for (task_id,) in cursor.fetchall():
            row = self.claim_suspect_by_id(cursor, self.decode_id(task_id), worker_id)
            if row is not None:
                return row
        return None

    def claim_suspect_by_id(
        self, cursor: CursorWrapper, task_id: uuid.UUID, worker_id: str
    ) -> ClaimedRow | None:
        """Mark suspect ``task_id`` RUNNING for ``worker_id`` (None if another took it)."""
        raise NotImplementedError

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
            params += [self.encode_id(task_id) for task_id in keep]
        cursor.execute(
            *self._requeue_sql(
                where=where,
                where_params=params,
                error_class=WORKER_STOPPED,
                message_sql=self.text_param,
                message_params=[reason],
            )
        )
        return cursor.rowcount

    # The worker table ----------------------------------------------------------------------

    def heartbeat(self, cursor: CursorWrapper, worker_id: str) -> bool:
        """Renew ``worker_id``'s lease by the database's clock; False if its row is gone."""
        now, params = self.now_sql()
        cursor.execute(
            f"UPDATE {self.workers} SET heartbeat_at = {now} WHERE id = %s", [*params, worker_id]
        )
        return cursor.rowcount > 0

    def live_worker(
        self, cursor: CursorWrapper, worker_id: str, lease_timeout: float
    ) -> tuple[int, str] | None:
        """The pid and host of ``worker_id`` if it heartbeat within ``lease_timeout`` seconds."""
        since, params = self.ago_sql(lease_timeout)
        cursor.execute(
            f"SELECT pid, hostname FROM {self.workers} WHERE id = %s AND heartbeat_at >= {since}",
            [worker_id, *params],
        )
        row = cursor.fetchone()
        return None if row is None else (row[0], row[1])

    def live_workers_like(
        self, cursor: CursorWrapper, prefix: str, lease_timeout: float
    ) -> list[tuple[str, int, str]]:
        """The id, pid and host of workers whose id starts with ``prefix`` and that heartbeat
        within ``lease_timeout`` seconds."""
        since, params = self.ago_sql(lease_timeout)
        # "!" escapes: a backslash would need escaping itself in MySQL's string literals.
        escaped = prefix.replace("!", "!!").replace("%", "!%").replace("_", "!_")
        cursor.execute(
            f"SELECT id, pid, hostname FROM {self.workers} "
            f"WHERE id LIKE %s ESCAPE '!' AND heartbeat_at >= {since}",
            [escaped + "%", *params],
        )
        return [(row[0], row[1], row[2]) for row in cursor.fetchall()]

    def forget_dead_workers(self, cursor: CursorWrapper, lease_timeout: float) -> int:
        """Delete the rows of workers silent for over ``lease_timeout`` seconds."""
        since, params = self.ago_sql(lease_timeout)
        cursor.execute(f"DELETE FROM {self.workers} WHERE heartbeat_at < {since}", params)
        return cursor.rowcount

    def queue_filter(
        self, queue_names: list[str] | None, backend_name: str
    ) -> tuple[str, list[Any]]:
        """The claim's conditions on the queue: one of ``queue_names`` (None: any), and not
        paused. The paused queues are read once per statement (an uncorrelated subquery) and
        each row is checked against them as a filter of the claim's index scan: a correlated
        NOT EXISTS was planned as an anti-join that sorted every due row of the queue (610 ms
        a claim beside 1,000,000 due tasks, against 2 ms)."""
        paused = f" AND queue_name {self.not_in_paused}"
        paused_params = [backend_name]
        if queue_names is None:
            return paused, paused_params
        marks = ", ".join(["%s"] * len(queue_names))
        return f" AND queue_name IN ({marks}){paused}", [*queue_names, *paused_params]

    @property
    def not_in_paused(self) -> str:
        """SQL for "not one of this backend's paused queues" (after a column name)."""
        return f"NOT IN (SELECT queue_name FROM {self.paused} WHERE backend_name = %s)"

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

    def make_due(self, cursor: CursorWrapper, *, backend_name: str, task_id: uuid.UUID) -> bool:
        """Make a deferred READY task due now, by the database's clock; False if it is not
        READY, is due already (it keeps its place), is a workflow step waiting for its turn
        (PARKED), or does not exist."""
        now, now_params = self.now_sql()
        cursor.execute(
            f"UPDATE {self.tasks} SET available_at = {now} WHERE id = %s AND backend_name = %s "
            f"AND status = 'READY' AND available_at > {now} AND available_at < %s",
            [
                *now_params,
                self.encode_id(task_id),
                backend_name,
                *now_params,
                self.encode_datetime(parked_at()),
            ],
        )
        return cursor.rowcount > 0

    def announce(self, cursor: CursorWrapper, queue_names: Sequence[str]) -> None:
        """Wake the workers of ``queue_names`` now (a queue resumed, a task made due), where
        the database can; elsewhere they see it at their next claim."""
