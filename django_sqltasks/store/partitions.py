"""The partitioned task table on PostgreSQL: building it (at migrate, or online beside a big
table), adding the days ahead, and dropping the days that are past their retention.

MariaDB, MySQL and SQLite keep one table: there, nothing here runs, and pruning deletes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from ..sql import dialect_for
from ..sql import partitions as sql

logger = logging.getLogger("django_sqltasks")

# Days of partitions made ahead: every worker may be down this long before finished tasks land
# in the default partition (which pruning then deletes from). Each empty partition costs the
# planning of a read by id a little: a few days, not weeks.
DAYS_AHEAD = 3
HISTORY_DAYS = 62  # days back given partitions of their own when a table is converted
MIGRATE_MAX_ROWS = 100_000  # larger tables are converted by tasks_partition, online
MOVE_BATCH = 10_000  # rows per statement moving history into the partitioned table
DROP_TRIES = 3  # a DROP that cannot have its lock in DDL_LOCK_TIMEOUT is tried this often

# By database alias: whether its task table was partitioned, and when that was looked at.
_layouts: dict[str, tuple[bool, float]] = {}


def partitioned(using: str) -> bool:
    """Whether the task table of ``using`` is the partitioned layout (PostgreSQL only)."""
    connection = connections[using]
    if not dialect_for(connection).partitions_tasks:
        return False
    with connection.cursor() as cursor:
        return sql.kind(cursor, _table()) == "p"


def partitioned_recently(using: str) -> bool:
    """``partitioned``, looked up at most once every ``sql.LAYOUT_RECHECK`` seconds: for the
    reads by id, which then name the partitions a task may be in. A stale answer costs only
    speed: the condition those reads add holds in either layout."""
    if not dialect_for(connections[using]).partitions_tasks:
        return False
    now = time.monotonic()
    known = _layouts.get(using)
    if known is None or now - known[1] > sql.LAYOUT_RECHECK:
        known = (partitioned(using), now)
        _layouts[using] = known
    return known[0]


def analyze(connection: BaseDatabaseWrapper) -> None:
    """Gather the task table's statistics, its partitions' and its indexes' expressions'."""
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {connection.ops.quote_name(_table())}")


def _table() -> str:
    # App registry: store/ loads after it, but keep the table name in one place.
    from ..models import TaskRecord

    return TaskRecord._meta.db_table


def _today() -> date:
    return timezone.now().astimezone(sql.dt_timezone.utc).date()


# Upkeep ------------------------------------------------------------------------------------


def add_days(using: str, *, days_ahead: int = DAYS_AHEAD, today: date | None = None) -> int:
    """Make sure each finished status has a partition for today and ``days_ahead`` days after;
    return how many were added. Idempotent, and safe for several workers at once: one holds
    an advisory lock while the others pass. A day that cannot be added now (its rows are in
    the default partition already, or a lock was not had in time) is tried again next time."""
    connection = connections[using]
    if not partitioned(using):
        return 0
    table = _table()
    start = today or _today()
    added = 0
    with transaction.atomic(using=using), connection.cursor() as cursor:
        if not sql.try_upkeep_lock(cursor):
            return 0
        for status in sql.HISTORY:
            have = {p.day for p in sql.day_partitions(cursor, table, status)}
            for offset in range(days_ahead + 1):
                day = start + timedelta(days=offset)
                if day not in have and _add_day(connection, cursor, table, status, day):
                    added += 1
    if added:
        logger.info(
            "Added %d partitions of finished tasks", added, extra={"action": "partitions_added"}
        )
    return added


def _add_day(
    connection: BaseDatabaseWrapper, cursor: CursorWrapper, table: str, status: str, day: date
) -> bool:
    has_rows, of_the_day = sql.default_rows(cursor, table, status, day)
    if of_the_day:  # an attach would scan the default partition only to fail: not tried
        logger.warning(
            "Could not add the partition of %s tasks finished on %s: some are in the default "
            "partition already, where they stay until pruned",
            status,
            day,
            extra={"action": "partition_not_added"},
        )
        return False
    try:
        with transaction.atomic(using=connection.alias):  # a savepoint: one day fails alone
            for statement in sql.add_day_statements(table, status, day, default_has_rows=has_rows):
                cursor.execute(statement)
    except DatabaseError as e:
        logger.warning(
            "Could not add the partition of %s tasks finished on %s (tried again later): %s",
            status,
            day,
            e,
            extra={"action": "partition_not_added"},
        )
        return False
    return True


# Pruning -----------------------------------------------------------------------------------


@dataclass
class Dropped:
    """The day partitions a prune dropped, and the tasks they held."""

    partitions: list[str] = field(default_factory=list)
    tasks: int = 0


def drop_before(
    using: str, status: str, cutoff: datetime, *, backend: str | None, queue: str | None
) -> Dropped:
    """Drop each day partition of ``status`` that ends at or before ``cutoff`` and holds only
    tasks of the scope (``backend`` and ``queue``, None: any). What is left of the tasks
    finished at or before ``cutoff`` (the partition straddling it, the default partition, a
    partition shared with another scope) is for the caller's batched DELETE."""
    dropped = Dropped()
    if not partitioned(using):
        return dropped
    connection = connections[using]
    table = _table()
    with connection.cursor() as cursor:
        for partition in sql.day_partitions(cursor, table, status):
            if partition.end > cutoff:
                break
            if sql.outside_scope(cursor, partition.name, backend, queue):
                continue
            count = sql.count_rows(cursor, partition.name)
            if _drop(connection, cursor, partition.name):
                dropped.partitions.append(partition.name)
                dropped.tasks += count
    return dropped


def straddled_day(using: str, status: str, cutoff: datetime) -> sql.DayPartition | None:
    """The day partition of ``status`` that ``cutoff`` falls in, if the table is partitioned
    and has one."""
    if not partitioned(using):
        return None
    with connections[using].cursor() as cursor:
        for partition in sql.day_partitions(cursor, _table(), status):
            if partition.start <= cutoff < partition.end:
                return partition
    return None


def _drop(connection: BaseDatabaseWrapper, cursor: CursorWrapper, name: str) -> bool:
    dialect = dialect_for(connection)
    for attempt in range(1, DROP_TRIES + 1):
        try:
            with transaction.atomic(using=connection.alias):
                for statement in sql.drop_statements(name):
                    cursor.execute(statement)
            return True
        except DatabaseError as e:
            if not dialect.is_contention(e) or attempt == DROP_TRIES:
                logger.warning(
                    "Could not drop partition %s (its tasks are deleted instead): %s",
                    name,
                    e,
                    extra={"action": "partition_not_dropped"},
                )
                return False
    return False


# Building the layout -------------------------------------------------------------------------


def build(
    connection: BaseDatabaseWrapper,
    *,
    history_days: int = HISTORY_DAYS,
    say: Callable[[str], None] | None = None,
    dry_run: bool = False,
) -> None:
    """Create the partitioned table beside the plain one (empty, under a name of its own), with
    the plain table's indexes and a partition for each day of its recent history."""
    table = _table()
    with connection.cursor() as cursor:
        indexes = sql.indexes_of(cursor, table)
        low, high = sql.finished_span(cursor, table)
        statements = [*sql.layout_statements(table), *sql.index_statements(indexes, table)]
        today = _today()
        first = max(today - timedelta(days=history_days), low.date() if low else today)
        last = max(today, high.date() if high else today) + timedelta(days=DAYS_AHEAD)
        days = [first + timedelta(days=n) for n in range((last - first).days + 1)]
        for status in sql.HISTORY:
            for day in days:
                statements += sql.add_day_statements(table, status, day, like=table + sql.STAGING)
        _run(connection, cursor, statements, say, dry_run)


def swap(
    connection: BaseDatabaseWrapper,
    *,
    say: Callable[[str], None] | None = None,
    dry_run: bool = False,
) -> None:
    """In one short transaction: rename the plain table aside, give its name to the
    partitioned one, and move the live tasks into it."""
    table = _table()
    with connection.cursor() as cursor:
        indexes = sql.indexes_of(cursor, table)
        _run(
            connection,
            cursor,
            [*sql.swap_statements(table, indexes), *sql.copy_live_statements(table)],
            say,
            dry_run,
        )


def _run(
    connection: BaseDatabaseWrapper,
    cursor: CursorWrapper,
    statements: list[str],
    say: Callable[[str], None] | None,
    dry_run: bool,
) -> None:
    with transaction.atomic(using=connection.alias):
        for statement in statements:
            if say is not None:
                say(statement)
            if not dry_run:
                cursor.execute(statement)


def move_history(
    connection: BaseDatabaseWrapper,
    *,
    batch_size: int = MOVE_BATCH,
    on_batch: Callable[[int], None] | None = None,
) -> int:
    """Move the finished tasks left in the plain table into the partitioned one, newest first,
    one batch per transaction; then drop the plain table. Return the tasks moved."""
    table = _table()
    moved = 0
    with connection.cursor() as cursor:
        while True:
            with transaction.atomic(using=connection.alias):
                count = sql.move_history_batch(cursor, table, batch_size)
            moved += count
            if on_batch is not None:
                on_batch(moved)
            if count < batch_size:
                break
        with transaction.atomic(using=connection.alias):
            if sql.count_rows(cursor, table + sql.OLD) == 0:
                cursor.execute(f"DROP TABLE {sql.q(table + sql.OLD)}")
    return moved


def convert_at_migrate(connection: BaseDatabaseWrapper) -> None:
    """The migration's step: convert the (new, or small) plain table in place. A table past
    MIGRATE_MAX_ROWS is left for ``tasks_partition``, which converts it online."""
    if not dialect_for(connection).partitions_tasks:
        return  # MariaDB, MySQL, SQLite: one table
    table = _table()
    state = conversion_state(connection)
    if state == "moving":  # tasks_partition swapped the tables: it moves the rest
        return
    if state != "plain":
        return  # partitioned already (by tasks_partition)
    with connection.cursor() as cursor:
        if sql.more_rows_than(cursor, table, MIGRATE_MAX_ROWS):
            raise RuntimeError(
                f"The table {table} holds more than {MIGRATE_MAX_ROWS:,} tasks: convert it "
                "online first with 'manage.py tasks_partition' (see docs/operations.md), "
                "then run migrate again."
            )
    build(connection)
    swap(connection)
    move_history(connection)


def conversion_state(connection: BaseDatabaseWrapper) -> str:
    """Where the task table of ``connection`` stands: ``missing``, ``plain``, ``moving`` (the
    partitioned table is in place, finished tasks are left in the old one) or
    ``partitioned``."""
    table = _table()
    with connection.cursor() as cursor:
        state = sql.kind(cursor, table)
        if state is None:
            return "missing"
        if state != "p":
            return "plain"
        return "moving" if sql.exists(cursor, table + sql.OLD) else "partitioned"
