"""Every SQL statement of ``django_sqltasks/sql/`` rendered as each database receives it: the
files of ``sql/snapshots/``, written by ``scripts/sql_snapshots.py`` (``make sql-snapshots``).

The statements are assembled from Python fragments (the claim of PostgreSQL from pieces of
``claims.py`` and ``postgresql.py``); these files show each one whole, one folder per database,
one file per operation, each variant the code can produce under a header that names the method
and the arguments that produced it. ``tests/sql/test_snapshots.py`` renders them again and
fails when a committed file differs (it renders
in memory), so a change to a statement shows in its review as a change
to these files.

No database is needed: each dialect is made on a stand-in for its Django connection
(``OfflineConnection``: the quoting of names, datetimes passed through as they are), and runs
its statements on a cursor that records them (``RecordingCursor``) and answers with the rows
each variant gives it. A transaction a dialect opens (``Vendor._atomic``) is shown as comments
around its statements.
"""

from __future__ import annotations

import difflib
import re
import textwrap
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any
from unittest import mock

from django_sqltasks.core.claim_cost import ClaimCost

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT / "sql" / "snapshots"
COMMAND = "make sql-snapshots"
VENDORS = ("postgresql", "mysql", "sqlite")
WIDTH = 100  # characters a line is wrapped at, outside quoted text
# Clauses a one-line statement is broken before, where they are not inside parentheses.
CLAUSES = re.compile(
    r"(?<!FOR) (?=(?:FROM|WHERE|ORDER BY|GROUP BY|LIMIT|SET|VALUES|RETURNING|ON CONFLICT"
    r"|UNION ALL|FOR UPDATE|SELECT|INSERT INTO|PARTITION BY|USING)\b)"
)

# The fixed inputs every variant is rendered with.
UTC = timezone.utc
# A backend name no settings configure: statements that read its OPTIONS take their defaults
# but for CLAIM_SYNCHRONOUS_COMMIT, whose False (the default) shows on a configured backend only.
BACKEND = "shop"
WORKER = "host-1234-abcd"
AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
DAY = date(2026, 1, 2)
TABLE = "django_sqltasks_taskrecord"


# What a worker's claims cost over the last minute, as its heartbeat publishes it.
CLAIMS = ClaimCost(
    count=120, rows=300, mean=0.0003, p99=0.0012, max=0.004, full_passes=2, full_pass_max=0.002
)


def _id(n: int) -> uuid.UUID:
    return uuid.UUID(f"01940000-0000-7000-8000-{n:012d}")


class OfflineOperations:
    """What a dialect asks of ``connection.ops``: the quoting of names, and datetimes, which
    are passed through (shown as values, whatever the driver would make of them)."""

    def __init__(self, quote: str) -> None:
        self.quote = quote

    def quote_name(self, name: str) -> str:
        if name.startswith(self.quote) and name.endswith(self.quote):
            return name
        return f"{self.quote}{name}{self.quote}"

    def adapt_datetimefield_value(self, value: Any) -> Any:
        return value


class OfflineConnection:
    """A stand-in for a Django connection of ``vendor``, with no database behind it."""

    def __init__(self, vendor: str) -> None:
        self.vendor = vendor
        self.alias = f"sql-snapshots-{vendor}"
        self.ops = OfflineOperations("`" if vendor == "mysql" else '"')
        self.settings_dict: dict[str, Any] = {"NAME": "", "OPTIONS": {}}


@dataclass
class Statement:
    sql: str
    params: Sequence[Any] | None = None  # None: a comment, not a statement
    note: str = ""


class RecordingCursor:
    """A cursor that records what is executed on it and returns ``results`` in turn (each a
    list of rows; none left: no row)."""

    def __init__(self, results: Sequence[list[tuple[Any, ...]]] = ()) -> None:
        self.statements: list[Statement] = []
        self._results = list(results)
        self._rows: list[tuple[Any, ...]] = []
        self.rowcount = 0
        self.cursor = self  # the driver's cursor, for PostgreSQL's COPY
        self.description = None

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> None:
        self.statements.append(Statement(sql, list(params or [])))
        self._rows = self._results.pop(0) if self._results else []
        self.rowcount = len(self._rows)

    def fetchall(self) -> list[tuple[Any, ...]]:
        return list(self._rows)

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows[0] if self._rows else None

    @contextmanager
    def copy(self, sql: str) -> Iterator[Any]:
        rows: list[Sequence[Any]] = []

        class Copy:
            def write_row(self, row: Sequence[Any]) -> None:
                rows.append(row)

        yield Copy()
        self.statements.append(Statement(sql, [], note=f"then {len(rows)} rows, one per task"))


def _recorded_atomic(self: Any) -> Iterator[None]:
    self.recorder.statements.append(Statement("-- transaction.atomic(): begins"))
    yield
    self.recorder.statements.append(Statement("-- transaction.atomic(): commits"))


def offline_dialect(vendor: str) -> Any:
    """The Dialect of ``vendor`` on an OfflineConnection, whose transactions are recorded."""
    from django_sqltasks.sql import DIALECTS

    base = DIALECTS[vendor]
    cls = type(f"Offline{base.__name__}", (base,), {"_atomic": contextmanager(_recorded_atomic)})
    return cls(OfflineConnection(vendor))


# The variants ---------------------------------------------------------------------------------


def _task(n: int = 1, **fields: Any) -> Any:
    from django_sqltasks.sql import NewTask

    values: dict[str, Any] = {
        "id": _id(n),
        "task_path": "shop.tasks.send_receipt",
        "backend_name": BACKEND,
        "queue_name": "default",
        "priority": 0,
        "args": [42],
        "kwargs": {},
        "enqueued_at": AT,
        "run_after": None,
        "args_json": "[42]",
        "kwargs_json": "{}",
    }
    values.update(fields)
    return NewTask(**values)


def _outcomes() -> list[Any]:
    from django_sqltasks.sql import Outcome

    return [
        Outcome(id=_id(1), status="SUCCESSFUL", finished_at=AT, return_value='{"sent": true}'),
        Outcome(
            id=_id(2),
            status="FAILED",
            finished_at=AT,
            return_value=None,
            error_class="shop.errors.PaymentDeclined",
            error_traceback="Traceback (most recent call last): ...",
            attempt=1,
        ),
        Outcome(id=_id(3), status="READY", finished_at=None, return_value=None, delay=30.0),
    ]


def _claimed_values() -> tuple[Any, ...]:
    """A READY row as a claim's locking SELECT returns it (MySQL), with the claim's time."""
    return (
        _id(1).hex,
        "shop.tasks.send_receipt",
        BACKEND,
        "default",
        5,
        "[42]",
        "{}",
        AT,
        None,
        None,
        None,
        "[]",
        "[]",
        0,
        0,
        None,
        None,
        AT,
    )


@dataclass(frozen=True)
class Variant:
    """One way the code calls a statement: ``call`` says how, for the header."""

    call: str
    run: Callable[[Any, RecordingCursor], object]
    # The rows the database returns to each statement, in turn, by vendor.
    results: Callable[[str], Sequence[list[tuple[Any, ...]]]] = lambda vendor: ()
    vendors: tuple[str, ...] = VENDORS
    note: str = ""


@dataclass(frozen=True)
class Operation:
    """The statements of one operation (a file per database), in all their variants."""

    name: str
    about: str  # what the statements do, for the file's header
    variants: tuple[Variant, ...]
    vendors: tuple[str, ...] = VENDORS


def _claim(limit: int = 10, **kwargs: Any) -> Callable[[Any, RecordingCursor], object]:
    def run(d: Any, c: RecordingCursor) -> object:
        options = {"backend_name": BACKEND, "queue_names": None, "worker_id": WORKER}
        return d.claim(c, limit=limit, **{**options, **kwargs})

    return run


def _claim_results(vendor: str) -> Sequence[list[tuple[Any, ...]]]:
    """PostgreSQL: one document of no row. Elsewhere, the walk: two priorities with due tasks
    (5 and 0), the first giving one row (MySQL: locked, then marked RUNNING), the second none."""
    if vendor == "postgresql":
        return [[(None,)]]
    if vendor == "mysql":
        return [[(5,), (0,)], [_claimed_values()], [], []]
    return [[(5,), (0,)], [], []]


def _scope(**fields: Any) -> Any:
    from django_sqltasks.sql import Scope

    return Scope(**fields)


def operations() -> list[Operation]:
    """Every operation rendered, in the order of the dialect's groups (dialect.py)."""
    from django_sqltasks.sql import ANY_LIMIT

    return [
        # tasks.py
        Operation(
            "insert",
            "a new task's INSERT, one row or several, with or without a wake-up",
            (
                Variant("insert(cursor, [task])", lambda d, c: d.insert(c, [_task()])),
                Variant(
                    "insert(cursor, [task], notify=True)",
                    lambda d, c: d.insert(c, [_task()], notify=True),
                ),
                Variant(
                    "insert(cursor, [task, task_run_after]): several rows",
                    lambda d, c: d.insert(c, [_task(1), _task(2, run_after=AT, tags=("vip",))]),
                ),
                Variant(
                    "insert(cursor, [task, task], notify=True)",
                    lambda d, c: d.insert(c, [_task(1), _task(2)], notify=True),
                ),
            ),
        ),
        Operation(
            "insert_deduplicated",
            "the INSERT of a task with a dedupe key, unless a live task holds the key",
            (
                Variant(
                    "insert_deduplicated(cursor, task_with_dedupe_key, notify=False)",
                    lambda d, c: d.insert_deduplicated(c, _task(dedupe_key="order-7"), False),
                ),
                Variant(
                    "insert_deduplicated(cursor, task_with_dedupe_key, notify=True)",
                    lambda d, c: d.insert_deduplicated(c, _task(dedupe_key="order-7"), True),
                ),
            ),
        ),
        Operation(
            "bulk_insert",
            "many tasks at once (bulk_enqueue): at most _bulk_chunk rows a statement; on "
            "PostgreSQL, COPY",
            (
                Variant(
                    "bulk_insert(cursor, [task, task], notify=True)",
                    lambda d, c: d.bulk_insert(c, [_task(1), _task(2)], notify=True),
                    results=lambda vendor: [[(AT,)]] if vendor == "postgresql" else (),
                ),
            ),
        ),
        Operation(
            "select_result",
            "reading one task by id (a result)",
            (
                Variant(
                    "select_result_sql(['id', 'status'])",
                    lambda d, c: c.execute(d.select_result_sql(["id", "status"])),
                ),
                Variant(
                    "select_result_sql(['id', 'status'], pruned=True)",
                    lambda d, c: c.execute(d.select_result_sql(["id", "status"], pruned=True)),
                ),
            ),
        ),
        Operation(
            "live_task_with_key",
            "the live task holding a dedupe key",
            (
                Variant(
                    "live_task_with_key(cursor, 'order-7')",
                    lambda d, c: d.live_task_with_key(c, "order-7"),
                ),
            ),
        ),
        Operation(
            "make_due",
            "a deferred task made due now (run_now)",
            (
                Variant(
                    "make_due(cursor, backend_name='shop', task_id=...)",
                    lambda d, c: d.make_due(c, backend_name=BACKEND, task_id=_id(1)),
                ),
            ),
        ),
        Operation(
            "finished_among",
            "which of some tasks have finished (result.wait())",
            (
                Variant(
                    "finished_among(cursor, [id, id])",
                    lambda d, c: d.finished_among(c, [_id(1), _id(2)]),
                ),
            ),
        ),
        Operation(
            "announce",
            "waking the workers of some queues",
            (
                Variant(
                    "announce(cursor, ['default', 'mail'])",
                    lambda d, c: d.announce(c, ["default", "mail"]),
                ),
            ),
            vendors=("postgresql",),
        ),
        Operation(
            "announce_finished",
            "telling the processes waiting on tasks that they finished (result.wait())",
            (
                Variant(
                    "announce_finished(cursor, [id, id])",
                    lambda d, c: d.announce_finished(c, [_id(1), _id(2)]),
                ),
            ),
            vendors=("postgresql",),
        ),
        # claims.py (the fair claim's round of keys: limit_keys.py)
        Operation(
            "claim",
            "the claim: up to a batch of due tasks marked RUNNING for a worker (on PostgreSQL, "
            "its SELECT adds \", set_config('synchronous_commit', 'off', true)\" on a backend "
            "whose OPTIONS CLAIM_SYNCHRONOUS_COMMIT is False, the default; on SQLite, the "
            "statements then run at PRAGMA synchronous = 1, the connection's level read before "
            "and set back after, outside a transaction)",
            (
                Variant("claim(cursor, limit=10): any queue", _claim(), _claim_results),
                Variant(
                    "claim(cursor, queue_names=['default'], limit=10): one queue",
                    _claim(queue_names=["default"]),
                    _claim_results,
                ),
                Variant(
                    "claim(cursor, queue_names=['default', 'mail'], limit=10, "
                    "scope=Scope(exclude_queues=('reports',))): queues, some limited",
                    _claim(
                        queue_names=["default", "mail"], scope=_scope(exclude_queues=("reports",))
                    ),
                    _claim_results,
                ),
                Variant(
                    "claim(cursor, limit=10, scope=Scope(limit_key='tenant-9')): one limit key",
                    _claim(scope=_scope(limit_key="tenant-9")),
                    _claim_results,
                ),
                Variant(
                    "claim(cursor, limit=10, scope=Scope(limit_key=ANY_LIMIT)): limited or not",
                    _claim(scope=_scope(limit_key=ANY_LIMIT)),
                    _claim_results,
                ),
            ),
        ),
        Operation(
            "claim_fair",
            "the fair claim (worker/fair.py): the priorities of a round's keys, then one pass "
            "per priority",
            (
                Variant(
                    "due_priorities_of_keys(cursor, keys=['tenant-1', 'tenant-2'])",
                    lambda d, c: d.due_priorities_of_keys(
                        c, backend_name=BACKEND, queue_names=None, keys=["tenant-1", "tenant-2"]
                    ),
                ),
                Variant(
                    "claim(cursor, limit=3, scope=Scope(limit_key='tenant-1', priority=0))",
                    _claim(limit=3, scope=_scope(limit_key="tenant-1", priority=0)),
                    _claim_results,
                ),
                Variant(
                    "claim_of_keys(cursor, exclude_queues=('reports',), priority=0, "
                    "wants=[('tenant-1', 2), ('tenant-2', 1)])",
                    lambda d, c: d.claim_of_keys(
                        c,
                        backend_name=BACKEND,
                        queue_names=None,
                        exclude_queues=("reports",),
                        worker_id=WORKER,
                        priority=0,
                        wants=[("tenant-1", 2), ("tenant-2", 1)],
                    ),
                    lambda vendor: (
                        [[(None, None)]] if vendor == "postgresql" else _claim_results(vendor)
                    ),
                ),
            ),
        ),
        # suspects.py
        Operation(
            "suspects",
            "suspects, the tasks that run alone after their worker died beside others",
            (
                Variant(
                    "suspects(cursor, queue_names=['default'], limit=2)",
                    lambda d, c: d.suspects(
                        c, backend_name=BACKEND, queue_names=["default"], limit=2
                    ),
                ),
                Variant(
                    "claim_suspect_by_id(cursor, task_id, worker_id)",
                    lambda d, c: d.claim_suspect_by_id(c, _id(1), WORKER),
                    lambda vendor: (
                        [[(None,)]]
                        if vendor == "postgresql"
                        else [[_claimed_values()]]
                        if vendor == "mysql"
                        else ()
                    ),
                ),
                Variant(
                    "clear_suspect(cursor, task_id, worker_id)",
                    lambda d, c: d.clear_suspect(c, _id(1), WORKER),
                ),
            ),
        ),
        # limit_keys.py
        Operation(
            "limit_keys",
            "the limit keys of waiting tasks (limited and fair queues)",
            (
                Variant(
                    "limit_keys(cursor, 'shop', after='', count=2)",
                    lambda d, c: d.limit_keys(c, BACKEND, "", 2),
                    lambda vendor: [[("tenant-1",)], [("tenant-2",)]],
                ),
                Variant(
                    "limit_keys_since(cursor, 'shop', after=None, count=500)",
                    lambda d, c: d.limit_keys_since(c, BACKEND, None, 500),
                ),
                Variant(
                    "limit_keys_since(cursor, 'shop', after=id, count=500)",
                    lambda d, c: d.limit_keys_since(c, BACKEND, _id(1).hex, 500),
                ),
            ),
        ),
        # outcomes.py
        Operation(
            "complete",
            "a batch of outcomes written, guarded by the owner and the attempt",
            (
                Variant(
                    "complete(cursor, worker_id, [successful, failed, retry in 30 s])",
                    lambda d, c: d.complete(c, WORKER, _outcomes()),
                    lambda vendor: [[(_id(1).hex, None)]] if vendor == "mysql" else (),
                ),
            ),
        ),
        Operation(
            "salvage",
            "a task failed when its outcome could not be stored",
            (
                Variant(
                    "salvage(cursor, worker_id, outcome, reason)",
                    lambda d, c: d.salvage(c, WORKER, _outcomes()[1], "The return value ..."),
                    lambda vendor: [[(1,)]],
                ),
            ),
        ),
        Operation(
            "requeue_orphans",
            "the rescue: the tasks of workers whose lease ran out, back in the queue (or failed)",
            (
                Variant(
                    "requeue_orphans(cursor, backend_name='shop', lease_timeout=30)",
                    lambda d, c: d.requeue_orphans(c, backend_name=BACKEND, lease_timeout=30),
                    # One lost worker, which ran two tasks.
                    lambda vendor: [[("worker-a", 2)]],
                ),
                Variant(
                    "requeue_orphans(cursor, backend_name='shop', lease_timeout=30, max_rescues=3)",
                    lambda d, c: d.requeue_orphans(
                        c, backend_name=BACKEND, lease_timeout=30, max_rescues=3
                    ),
                    # Two lost workers ran one task each.
                    lambda vendor: [[("worker-a", 1), ("worker-b", 1), ("worker-c", 3)], [(0,)]],
                ),
            ),
        ),
        Operation(
            "requeue_owned",
            "the tasks of a stopping worker, back in the queue",
            (
                Variant(
                    "requeue_owned(cursor, worker_id=..., reason=...)",
                    lambda d, c: d.requeue_owned(c, worker_id=WORKER, reason="Worker stopped."),
                ),
                Variant(
                    "requeue_owned(cursor, worker_id=..., reason=..., keep=[id])",
                    lambda d, c: d.requeue_owned(
                        c, worker_id=WORKER, reason="Worker stopped.", keep=[_id(1)]
                    ),
                ),
            ),
        ),
        # workers.py
        Operation(
            "workers",
            "the worker table: heartbeats and leases",
            (
                Variant("heartbeat(cursor, worker_id)", lambda d, c: d.heartbeat(c, WORKER)),
                Variant(
                    "heartbeat(cursor, worker_id, claims): the claims' cost published",
                    lambda d, c: d.heartbeat(c, WORKER, CLAIMS),
                ),
                Variant(
                    "live_worker(cursor, worker_id, lease_timeout=30)",
                    lambda d, c: d.live_worker(c, WORKER, 30),
                ),
                Variant(
                    "live_workers_like(cursor, 'host-1234', lease_timeout=30)",
                    lambda d, c: d.live_workers_like(c, "host-1234", 30),
                ),
                Variant(
                    "forget_dead_workers(cursor, lease_timeout=30)",
                    lambda d, c: d.forget_dead_workers(c, 30),
                ),
            ),
        ),
        # steps.py
        Operation(
            "insert_step",
            "a durable task's step record",
            (
                Variant(
                    "insert_step(cursor, task_id=..., kind='step', name='charge', ...)",
                    lambda d, c: d.insert_step(
                        c,
                        task_id=_id(1),
                        kind="step",
                        name="charge",
                        occurrence=0,
                        state="done",
                        attempts=1,
                        result={"charge": "ch_1"},
                        error="",
                        event_key=None,
                        wake_at=None,
                        started_at=AT,
                        finished_at=AT,
                    ),
                ),
            ),
        ),
        # vendor.py and health.py
        Operation(
            "clock",
            "the database's clock, and whether it answers",
            (
                Variant("db_now(cursor)", lambda d, c: d.db_now(c), lambda vendor: [[(AT,)]]),
                Variant("ping(cursor)", lambda d, c: d.ping(c), lambda vendor: [[(1,)]]),
            ),
        ),
        Operation(
            "table_health",
            "the task table's upkeep (ops/health.py)",
            (
                Variant(
                    "table_health(cursor)",
                    lambda d, c: d.table_health(c),
                    lambda vendor: (
                        [[], [(True, None, 10, 1, 30.0, 52.0, 60.0, *[None] * 12)]]
                        if vendor == "postgresql"
                        else ()
                    ),
                ),
            ),
            vendors=("postgresql", "mysql"),
        ),
        Operation(
            "health_probe",
            "what tasks_health reads and runs (ops/probe.py): each queue's oldest READY task, "
            "the earliest due tasks under a limit, its time limit, a write that changes nothing",
            (
                Variant(
                    "oldest_ready(cursor, backend_name, 'emails')",
                    lambda d, c: d.oldest_ready(c, BACKEND, "emails"),
                    lambda vendor: [[(None,)]],
                ),
                Variant(
                    "oldest_limited(cursor, backend_name, 100)",
                    lambda d, c: d.oldest_limited(c, BACKEND, 100),
                ),
                Variant(
                    "save_time_limits(cursor)",
                    lambda d, c: d.save_time_limits(c),
                    lambda vendor: [[(0, 31536000, 50)]] if vendor == "mysql" else [[(5000,)]],
                    vendors=("mysql", "sqlite"),
                ),
                Variant(
                    "limit_time(cursor, 5.0)",
                    lambda d, c: d.limit_time(c, 5.0),
                    vendors=("postgresql", "mysql"),
                ),
                Variant("write_nothing(cursor)", lambda d, c: d.write_nothing(c)),
            ),
        ),
    ]


# PostgreSQL only: the partitioned table (partitions.py) and the search (search.py) ------------


def _partition_statements() -> list[tuple[str, list[Statement]]]:
    from django_sqltasks.sql import partitions as p

    indexes = [
        p.IndexDef(
            f"{TABLE}_pkey",
            f"CREATE UNIQUE INDEX {TABLE}_pkey ON public.{TABLE} USING btree (id)",
            True,
            True,
        ),
        p.IndexDef(
            "sqltasks_ready_idx",
            f"CREATE INDEX sqltasks_ready_idx ON public.{TABLE} USING btree "
            "(backend_name, queue_name, priority DESC, available_at) "
            "WHERE (((status)::text = 'READY'::text) AND (limit_key IS NULL))",
            False,
            False,
        ),
        p.IndexDef(
            "sqltasks_finished_idx",
            f"CREATE INDEX sqltasks_finished_idx ON public.{TABLE} USING btree (finished_at) "
            "WHERE ((status)::text = ANY ((ARRAY['SUCCESSFUL'::character varying, "
            "'FAILED'::character varying])::text[]))",
            False,
            False,
        ),
    ]

    def listed(statements: list[str]) -> list[Statement]:
        return [Statement(sql, []) for sql in statements]

    def run(call: Callable[[RecordingCursor], object], *results: list[Any]) -> list[Statement]:
        cursor = RecordingCursor(results)
        call(cursor)
        return cursor.statements

    return [
        ("layout_statements(table)", listed(p.layout_statements(TABLE))),
        (
            "index_statements(indexes, table): for a primary key, a ready index, a finished index",
            listed(p.index_statements(indexes, TABLE)),
        ),
        ("swap_statements(table, indexes)", listed(p.swap_statements(TABLE, indexes))),
        ("copy_live_statements(table)", listed(p.copy_live_statements(TABLE))),
        (
            "move_history_batch(cursor, table, 1000)",
            run(lambda c: p.move_history_batch(c, TABLE, 1000)),
        ),
        ("kind(cursor, table)", run(lambda c: p.kind(c, TABLE))),
        (
            "day_partitions(cursor, table, 'SUCCESSFUL')",
            run(lambda c: p.day_partitions(c, TABLE, "SUCCESSFUL")),
        ),
        ("indexes_of(cursor, table)", run(lambda c: p.indexes_of(c, TABLE))),
        (
            "finished_span(cursor, table)",
            run(lambda c: p.finished_span(c, TABLE), [(None, None)]),
        ),
        ("count_rows(cursor, table)", run(lambda c: p.count_rows(c, TABLE), [(0,)])),
        (
            "more_rows_than(cursor, table, 1000)",
            run(lambda c: p.more_rows_than(c, TABLE, 1000), [(0,)]),
        ),
        ("try_upkeep_lock(cursor)", run(p.try_upkeep_lock, [(True,)])),
        (
            "add_day_statements(table, 'SUCCESSFUL', day)",
            listed(p.add_day_statements(TABLE, "SUCCESSFUL", DAY)),
        ),
        (
            "add_day_statements(table, 'SUCCESSFUL', day, default_has_rows=True)",
            listed(p.add_day_statements(TABLE, "SUCCESSFUL", DAY, default_has_rows=True)),
        ),
        (
            "default_rows(cursor, table, 'SUCCESSFUL', day)",
            run(lambda c: p.default_rows(c, TABLE, "SUCCESSFUL", DAY), [(True,)], [(False,)]),
        ),
        (
            "outside_scope(cursor, partition, backend='shop', queue='mail')",
            run(
                lambda c: p.outside_scope(
                    c, p.day_partition(TABLE, "FAILED", DAY), BACKEND, "mail"
                ),
                [(False,)],
            ),
        ),
        (
            "drop_statements(partition)",
            listed(p.drop_statements(p.day_partition(TABLE, "SUCCESSFUL", DAY))),
        ),
    ]


def _expression_sql(expression: Any, quote: Callable[[str], str]) -> str:
    """The SQL of an ORM expression made of Funcs over columns (F), as its own ``as_sql``
    writes it, compiled without a database."""
    from django.db.models import F

    class Operations:
        def check_expression_support(self, expression: Any) -> None:
            return None

    class Connection:
        ops = Operations()
        vendor = "postgresql"

    class Compiler:
        def compile(self, node: Any) -> tuple[str, list[Any]]:
            if isinstance(node, F):
                return quote(node.name), []
            return node.as_sql(self, Connection())

    sql, params = Compiler().compile(expression)
    assert not params, params
    return sql


def _search_statements() -> list[tuple[str, list[Statement]]]:
    from django_sqltasks.sql.search import ArgumentValues, ErrorClassName, LastErrorClass

    quote = OfflineOperations('"').quote_name
    return [
        (f"{cls.__name__}()", [Statement(_expression_sql(cls(), quote), [])])
        for cls in (ArgumentValues, LastErrorClass, ErrorClassName)
    ]


# Rendering ----------------------------------------------------------------------------------

PRODUCTS = {"postgresql": "PostgreSQL", "mysql": "MySQL and MariaDB", "sqlite": "SQLite"}
HEADER = "Generated by {command} (scripts/sql_snapshots.py) from django_sqltasks/sql/: do not edit."


def _marks() -> dict[datetime, str]:
    from django_sqltasks.sql import rows

    return {
        getattr(rows, name): name
        for name in ("SUSPECT", "SUSPECT_UNBOUNDED", "SUSPECT_CLEARED", "PARKED")
    }


def _param(value: Any, now: datetime, marks: dict[datetime, str]) -> str:
    if isinstance(value, datetime):
        if value in marks:
            return f"{value.isoformat()} ({marks[value]})"
        offset = round((value - now).total_seconds())
        if abs(offset) < 86400:  # made from this process's clock while rendering
            return "<now, by this process's clock>" if offset == 0 else f"<now {offset:+d} s>"
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return f"UUID('{value}')"
    return repr(value)


def _wrap(line: str) -> list[str]:
    """``line`` broken at spaces outside quoted text into lines of at most WIDTH characters
    (a longer word stays whole), continued four spaces further in."""
    if len(line) <= WIDTH:
        return [line]
    indent = len(line) - len(line.lstrip())
    breaks, quoted = [], False
    for i, char in enumerate(line):
        if char == "'":
            quoted = not quoted
        elif char == " " and not quoted and i > indent:
            breaks.append(i)
    lines, start, prefix = [], 0, ""
    while len(prefix) + len(line) - start > WIDTH:
        limit = start + WIDTH - len(prefix)
        fits = [b for b in breaks if start < b <= limit]
        cut = fits[-1] if fits else next((b for b in breaks if b > start), None)
        if cut is None:
            break
        lines.append(prefix + line[start:cut].rstrip())
        start, prefix = cut + 1, " " * (indent + 4)
    lines.append(prefix + line[start:])
    return lines


def _split_clauses(line: str) -> list[str]:
    """A one-line statement broken before its top-level clauses (outside parentheses and
    quoted text)."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, char in enumerate(line):
        if char == "'":
            quoted = not quoted
        elif not quoted and char == "(":
            depth += 1
        elif not quoted and char == ")":
            depth -= 1
        elif not quoted and depth == 0 and i > start and CLAUSES.match(line, i):
            parts.append(line[start:i])
            start = i + 1
    parts.append(line[start:])
    return [part.strip() for part in parts if part.strip()]


def tidy(sql: str) -> str:
    """``sql`` laid out for reading: a hand-formatted statement dedented by its first line (a
    line of an embedded fragment, less indented, four spaces in), a one-line one broken before
    its clauses, every line wrapped at WIDTH."""
    lines = [line.rstrip() for line in sql.split("\n") if line.strip()]
    if len(lines) == 1:
        lines = _split_clauses(lines[0].strip())
    base = len(lines[0]) - len(lines[0].lstrip())
    out = []
    for line in lines:
        indent = len(line) - len(line.lstrip())
        out.append(line[base:] if indent >= base else "    " + line.lstrip())
    return "\n".join(wrapped for line in out for wrapped in _wrap(line))


def _runs(params: Sequence[Any]) -> Iterator[tuple[int, int, Any]]:
    """The parameters, numbered from 1, with a run of five or more whole numbers that count
    down or up by one (the priorities of a probe per priority) as one line."""
    n = 0
    while n < len(params):
        end = n + 1
        value = params[n]
        if type(value) is int:
            step = None
            while end < len(params) and type(params[end]) is int:
                difference = params[end] - params[end - 1]
                if difference not in (1, -1) or step not in (None, difference):
                    break
                step, end = difference, end + 1
        if end - n >= 5:
            yield n + 1, end, f"{params[n]}, {params[n + 1]}, ..., {params[end - 1]}"
        else:
            end = n + 1
            yield n + 1, n + 1, value
        n = end


def _render_statements(statements: Sequence[Statement], now: datetime) -> str:
    if not statements:
        return "-- (no statement on this database)"
    marks, blocks = _marks(), []
    for statement in statements:
        if statement.params is None:
            blocks.append(statement.sql)
            continue
        text = tidy(statement.sql) + ";"
        if statement.note:
            text += f"\n-- {statement.note}"
        for first, last, shown in _runs(statement.params):
            number = str(first) if first == last else f"{first} to {last}"
            text += f"\n-- %s {number}: {shown if first != last else _param(shown, now, marks)}"
        blocks.append(text)
    return "\n".join(blocks)


def _defined_in(dialect: Any, method: str) -> str:
    for cls in type(dialect).__mro__[1:]:
        if method in vars(cls):
            return f"{cls.__name__}.{method} ({cls.__module__.replace('.', '/')}.py)"
    raise AttributeError(method)


def _file(
    vendor: str, title: str, sections: list[tuple[str, list[Statement]]], now: datetime
) -> str:
    header = f"{HEADER.format(command=COMMAND)} {PRODUCTS[vendor]}: {title}."
    text = "".join(f"-- {line}\n" for line in textwrap.wrap(header, WIDTH - 3))
    for call, statements in sections:
        text += f"\n-- {call}\n" + _render_statements(statements, now) + "\n"
    return text


def render() -> dict[Path, str]:
    """Every snapshot file, by its path under SNAPSHOTS, as the dialects render it now."""
    from django.test import override_settings
    from django.utils import timezone as dj_timezone

    files: dict[Path, str] = {}
    now = datetime.now(UTC)
    # What the statements depend on in settings: datetimes stored with their time zone. The
    # dialects' clock stands still at ``now`` while they render, so that a value made "now"
    # reads as now however long rendering takes (on a loaded machine, over half a second made
    # it "now +1 s").
    with (
        override_settings(USE_TZ=True, TIME_ZONE="UTC"),
        mock.patch.object(dj_timezone, "now", return_value=now),
    ):
        for vendor in VENDORS:
            dialect = offline_dialect(vendor)
            for operation in operations():
                if vendor not in operation.vendors:
                    continue
                sections = []
                for variant in operation.variants:
                    if vendor not in variant.vendors:
                        continue
                    cursor = RecordingCursor(variant.results(vendor))
                    dialect.recorder = cursor
                    variant.run(dialect, cursor)
                    method = variant.call.split("(")[0]
                    call = f"{variant.call}\n--   {_defined_in(dialect, method)}"
                    sections.append((call, cursor.statements))
                path = Path(vendor, f"{operation.name}.sql")
                files[path] = _file(vendor, operation.about, sections, now)
        files[Path("postgresql", "partitions.sql")] = _file(
            "postgresql",
            "the partitioned task table (django_sqltasks/sql/partitions.py), for the table "
            f"{TABLE} and the day {DAY}",
            _partition_statements(),
            now,
        )
        files[Path("postgresql", "search.sql")] = _file(
            "postgresql",
            "the admin's search expressions (django_sqltasks/sql/search.py), as the search "
            "indexes are built on them (django_sqltasks/indexes.py)",
            _search_statements(),
            now,
        )
    return files


def differences(rendered: dict[Path, str], folder: Path = SNAPSHOTS) -> list[str]:
    """A unified diff for each file of ``folder`` that differs from ``rendered``, is missing
    or is not rendered any more."""
    found = []
    on_disk = {path.relative_to(folder) for path in folder.rglob("*.sql")}
    for path in sorted(on_disk | set(rendered)):
        old = (folder / path).read_text() if path in on_disk else ""
        new = rendered.get(path, "")
        if old != new:
            diff = difflib.unified_diff(
                old.splitlines(keepends=True),
                new.splitlines(keepends=True),
                f"sql/snapshots/{path} (committed)",
                f"sql/snapshots/{path} (rendered)",
            )
            found.append("".join(diff))
    return found


def write(rendered: dict[Path, str], folder: Path = SNAPSHOTS) -> None:
    for path in folder.rglob("*.sql"):
        if path.relative_to(folder) not in rendered:
            path.unlink()
    for path, text in rendered.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
