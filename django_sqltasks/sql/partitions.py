"""PostgreSQL: the task table partitioned so that history is dropped, not deleted.

The layout of the task table ``T`` (docs/databases.md):

    T                      PARTITION BY LIST (status)
      T_live               FOR VALUES IN ('READY', 'RUNNING'): every live task, a small table
      T_successful         FOR VALUES IN ('SUCCESSFUL') PARTITION BY RANGE (finished_at)
        T_successful_YYYYMMDD   one UTC day of finished_at
        T_successful_default    DEFAULT: a day with no partition of its own, or NULL
      T_failed             FOR VALUES IN ('FAILED'), likewise

A task that finishes moves from ``T_live`` to its day's partition (row movement on the UPDATE of
its status); a retry moves it back. The parent has no primary key (one would have to include
status and finished_at): each leaf has a unique index on ``id``, and the dedupe index (unique
on dedupe_key) lives on ``T_live`` only. The other indexes are declared on the parent and exist
in every leaf. SUCCESSFUL and FAILED have branches of their own because they are kept for
different numbers of days (14 and 30 by default): each branch's old days are dropped whole.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from datetime import timezone as dt_timezone

from django.db.backends.utils import CursorWrapper

LIVE = ("READY", "RUNNING")
HISTORY = ("SUCCESSFUL", "FAILED")
STAGING = "_partitioned"  # suffix of the new table while it is built beside the old one
OLD = "_unpartitioned"  # suffix of the old table once the new one has its name
INDEX_STAGING = "_p"  # suffix of the new table's index names until the swap
# One key for the advisory lock of partition upkeep, so two workers never add the same day.
UPKEEP_LOCK_KEY = 0x5174_6173  # "Qtas"
# Seconds a DDL statement may wait for its lock before it gives up (and is tried again later):
# a DROP or ATTACH waiting behind a long read would hold up every write queued behind it.
DDL_LOCK_TIMEOUT = "500ms"
LAYOUT_RECHECK = 60.0  # seconds a read by id trusts the last look at the table's layout
KIND_SQL = "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)"  # param: quoted name
# The live tasks' autovacuum settings (docs/operations.md, "A busy database"). The partition
# holds few live rows beside many dead versions (each claim and each finish leaves one): the
# default trigger, 20% of the live rows, means nothing there, and the default cost delay makes a
# pass over a bloated partition crawl. Vacuum it whenever 1,000 versions are dead, at full
# speed (it is small once vacuumed), and analyze it as often, so the claim is never planned
# from statistics taken while it held a handful of rows. Autovacuum's naptime (one visit per
# database a minute by default) still bounds how often; a project tunes these with ALTER TABLE.
LIVE_STORAGE = (
    "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, "
    "autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 1000, "
    "autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 1000, "
    "autovacuum_vacuum_cost_delay = 0"
)


def q(name: str) -> str:
    """``name`` as a quoted identifier."""
    return '"' + name.replace('"', '""') + '"'


def branch(table: str, status: str) -> str:
    """The partition of ``table`` holding the tasks of one finished ``status``."""
    return f"{table}_{status.lower()}"


def live(table: str) -> str:
    return f"{table}_live"


def day_partition(table: str, status: str, day: date) -> str:
    return f"{branch(table, status)}_{day:%Y%m%d}"


def default_partition(table: str, status: str) -> str:
    return f"{branch(table, status)}_default"


def day_start(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=dt_timezone.utc)


@dataclass(frozen=True)
class DayPartition:
    """One day of one finished status: ``finished_at`` in [start, end)."""

    name: str
    day: date

    @property
    def start(self) -> datetime:
        return day_start(self.day)

    @property
    def end(self) -> datetime:
        return day_start(self.day + timedelta(days=1))


def kind(cursor: CursorWrapper, table: str) -> str | None:
    """``p`` when ``table`` is partitioned, ``r`` when a plain table, None when missing."""
    cursor.execute(KIND_SQL, [q(table)])
    row = cursor.fetchone()
    return None if row is None else str(row[0])


def exists(cursor: CursorWrapper, table: str) -> bool:
    return kind(cursor, table) is not None


def day_partitions(cursor: CursorWrapper, table: str, status: str) -> list[DayPartition]:
    """The day partitions of ``status``'s branch, oldest first (the default one left out)."""
    cursor.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass(%s)",
        [q(branch(table, status))],
    )
    pattern = re.compile(re.escape(branch(table, status)) + r"_(\d{8})$")
    found = []
    for (name,) in cursor.fetchall():
        match = pattern.match(name)
        if match:
            found.append(DayPartition(name, datetime.strptime(match[1], "%Y%m%d").date()))
    return sorted(found, key=lambda p: p.day)


# Building the layout ------------------------------------------------------------------------


def layout_statements(table: str) -> list[str]:
    """Create the partitioned table beside the plain ``table`` (named with STAGING), with its
    columns, defaults and checks, its live leaf and its two branches with their default
    partitions. The leaves have their final names already."""
    staging = table + STAGING
    statements = [
        f"CREATE TABLE {q(staging)} (LIKE {q(table)} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
        "INCLUDING GENERATED INCLUDING STORAGE) PARTITION BY LIST (status)",
        f"CREATE TABLE {q(live(table))} PARTITION OF {q(staging)} "
        f"FOR VALUES IN ('READY', 'RUNNING') WITH ({LIVE_STORAGE})",
        _unique_id(live(table)),
    ]
    for status in HISTORY:
        statements += [
            f"CREATE TABLE {q(branch(table, status))} PARTITION OF {q(staging)} "
            f"FOR VALUES IN ('{status}') PARTITION BY RANGE (finished_at)",
            f"CREATE TABLE {q(default_partition(table, status))} PARTITION OF "
            f"{q(branch(table, status))} DEFAULT",
            _unique_id(default_partition(table, status)),
        ]
    return statements


def _unique_id(leaf: str) -> str:
    # The primary key of a leaf: the parent can have none, as it would have to include the keys
    # of every level of partitions.
    return f"CREATE UNIQUE INDEX IF NOT EXISTS {q(leaf + '_id')} ON {q(leaf)} (id)"


@dataclass(frozen=True)
class IndexDef:
    """One index of the plain table, as PostgreSQL describes it."""

    name: str
    definition: str  # pg_get_indexdef()
    unique: bool
    primary: bool


def indexes_of(cursor: CursorWrapper, table: str) -> list[IndexDef]:
    cursor.execute(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisunique, i.indisprimary "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = to_regclass(%s) ORDER BY c.relname",
        [q(table)],
    )
    return [IndexDef(str(n), str(d), bool(u), bool(p)) for n, d, u, p in cursor.fetchall()]


_ON = re.compile(r"^CREATE (UNIQUE )?INDEX (\S+) ON (ONLY )?(\S+) USING ")


def index_statements(indexes: Sequence[IndexDef], table: str) -> list[str]:
    """The plain ``table``'s indexes again, on the partitioned one beside it (named with
    INDEX_STAGING until the swap): each on the parent (so in every leaf, and in every partition
    added later), but on the live leaf only those of live tasks (the claim's, the rescue's,
    the dedupe index, which is unique: a unique index of the parent would have to include the
    partition keys); no primary key (each leaf has its own). Each index of a leaf costs the
    planning of a statement that reads every leaf (a read by id): with the claim's four
    partial indexes in each of 62 leaves, twice as long as without."""
    statements = []
    for index in indexes:
        if index.primary:
            continue
        target = live(table) if index.unique or _of_live_tasks(index) else table + STAGING
        match = _ON.match(index.definition)
        if match is None:  # every btree index matches; anything else is named, not guessed
            raise ValueError(f"Cannot recreate index {index.name}: {index.definition}")
        statements.append(
            f"CREATE {match[1] or ''}INDEX {q(index.name + INDEX_STAGING)} ON {q(target)} USING "
            + index.definition[match.end() :]
        )
    return statements


def _of_live_tasks(index: IndexDef) -> bool:
    """Whether ``index`` holds live tasks only: its predicate names READY or RUNNING, and
    neither finished status."""
    where = index.definition.partition(" WHERE ")[2]
    return bool(re.search(r"'(READY|RUNNING)'", where)) and not re.search(
        r"'(SUCCESSFUL|FAILED)'", where
    )


def swap_statements(table: str, indexes: Sequence[IndexDef]) -> list[str]:
    """Give the partitioned table (and its indexes) the names of the plain one, which is
    renamed aside; run in one short transaction with the plain table locked."""
    statements = [
        f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'",
        f"LOCK TABLE {q(table)} IN ACCESS EXCLUSIVE MODE",
        f"ALTER TABLE {q(table)} RENAME TO {q(table + OLD)}",
    ]
    for index in indexes:
        if not index.primary:
            statements.append(f"ALTER INDEX {q(index.name)} RENAME TO {q(index.name + OLD)}")
    statements.append(f"ALTER TABLE {q(table + STAGING)} RENAME TO {q(table)}")
    for index in indexes:
        if not index.primary:
            statements.append(
                f"ALTER INDEX {q(index.name + INDEX_STAGING)} RENAME TO {q(index.name)}"
            )
    return statements


def copy_live_statements(table: str) -> list[str]:
    """Move the live tasks from the plain table (renamed aside) into the partitioned one."""
    old = q(table + OLD)
    return [
        f"INSERT INTO {q(table)} SELECT * FROM {old} WHERE status IN ('READY', 'RUNNING')",
        f"DELETE FROM {old} WHERE status IN ('READY', 'RUNNING')",
    ]


def move_history_batch(cursor: CursorWrapper, table: str, batch_size: int) -> int:
    """Move up to ``batch_size`` of the newest tasks left in the plain table into the
    partitioned one, in one statement (a row is in exactly one of them at any time)."""
    old = q(table + OLD)
    cursor.execute(
        f"WITH moved AS (DELETE FROM {old} WHERE id IN (SELECT id FROM {old} ORDER BY id DESC "
        f"LIMIT %s) RETURNING *) INSERT INTO {q(table)} SELECT * FROM moved",
        [batch_size],
    )
    return cursor.rowcount


def finished_span(cursor: CursorWrapper, table: str) -> tuple[datetime | None, datetime | None]:
    """The oldest and newest finished_at of finished tasks in ``table`` (its finished index)."""
    cursor.execute(
        f"SELECT min(finished_at), max(finished_at) FROM {q(table)} "
        "WHERE status IN ('SUCCESSFUL', 'FAILED')"
    )
    low, high = cursor.fetchone()
    return low, high


def count_rows(cursor: CursorWrapper, table: str) -> int:
    cursor.execute(f"SELECT count(*) FROM {q(table)}")
    return int(cursor.fetchone()[0])


def more_rows_than(cursor: CursorWrapper, table: str, limit: int) -> bool:
    cursor.execute(f"SELECT count(*) FROM (SELECT 1 FROM {q(table)} LIMIT %s) AS r", [limit + 1])
    return int(cursor.fetchone()[0]) > limit


# Upkeep: days ahead -----------------------------------------------------------------------


def try_upkeep_lock(cursor: CursorWrapper) -> bool:
    """Take the transaction's advisory lock of partition upkeep, if no one holds it."""
    cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [UPKEEP_LOCK_KEY])
    return bool(cursor.fetchone()[0])


def add_day_statements(
    table: str, status: str, day: date, *, like: str = "", default_has_rows: bool = False
) -> list[str]:
    """Add the partition of ``day`` to ``status``'s branch of ``table`` (whose columns are
    those of ``like``, the table itself by default): made apart and then attached, which locks
    the branch in SHARE UPDATE EXCLUSIVE mode (CREATE TABLE ... PARTITION OF would take ACCESS
    EXCLUSIVE, waiting for every read of the history and stopping every write).

    The attach scans the default partition for rows of the day, holding it ACCESS EXCLUSIVE
    (1,000,000 rows there stalled reads by id for a second): where it has rows
    (``default_has_rows``, none of that day), a CHECK that excludes the day is validated
    first, which scans it while reads and writes go on, and spares the attach its scan; it is
    dropped once the day is attached."""
    name = day_partition(table, status, day)
    start, end = day_start(day), day_start(day + timedelta(days=1))
    default = q(default_partition(table, status))
    guard = q(f"sqltasks_not_{day:%Y%m%d}")
    bounds = f"finished_at >= '{start.isoformat()}' AND finished_at < '{end.isoformat()}'"
    statements = [
        f"CREATE TABLE IF NOT EXISTS {q(name)} (LIKE {q(like or table)} INCLUDING DEFAULTS "
        "INCLUDING CONSTRAINTS INCLUDING GENERATED INCLUDING STORAGE)",
        _unique_id(name),
        f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'",
    ]
    if default_has_rows:
        statements += [
            f"ALTER TABLE {default} DROP CONSTRAINT IF EXISTS {guard}",
            f"ALTER TABLE {default} ADD CONSTRAINT {guard} "
            f"CHECK (NOT (finished_at IS NOT NULL AND {bounds})) NOT VALID",
            f"ALTER TABLE {default} VALIDATE CONSTRAINT {guard}",
        ]
    statements.append(
        f"ALTER TABLE {q(branch(table, status))} ATTACH PARTITION {q(name)} "
        f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
    )
    if default_has_rows:
        statements.append(f"ALTER TABLE {default} DROP CONSTRAINT {guard}")
    return statements


def default_rows(cursor: CursorWrapper, table: str, status: str, day: date) -> tuple[bool, bool]:
    """Whether ``status``'s default partition has rows, and rows finished on ``day`` (one
    probe of its finished index each)."""
    start, end = day_start(day), day_start(day + timedelta(days=1))
    cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {q(default_partition(table, status))})")
    any_rows = bool(cursor.fetchone()[0])
    if not any_rows:
        return False, False
    cursor.execute(
        f"SELECT EXISTS (SELECT 1 FROM {q(default_partition(table, status))} "
        "WHERE finished_at >= %s AND finished_at < %s)",
        [start, end],
    )
    return True, bool(cursor.fetchone()[0])


# Pruning ---------------------------------------------------------------------------------


def outside_scope(
    cursor: CursorWrapper, partition: str, backend: str | None, queue: str | None
) -> bool:
    """Whether ``partition`` holds a task of another backend or queue than the scope's (a
    sequential read of the partition that stops at the first such task)."""
    if backend is None and queue is None:
        return False
    conditions, params = [], []
    if backend is not None:
        conditions.append("backend_name = %s")
        params.append(backend)
    if queue is not None:
        conditions.append("queue_name = %s")
        params.append(queue)
    cursor.execute(
        f"SELECT EXISTS (SELECT 1 FROM {q(partition)} WHERE NOT ({' AND '.join(conditions)}))",
        params,
    )
    return bool(cursor.fetchone()[0])


def drop_statements(partition: str) -> list[str]:
    return [f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'", f"DROP TABLE {q(partition)}"]
