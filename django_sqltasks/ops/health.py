"""The task table under a long life: what keeps old row versions from being cleaned up.

Every claim and every outcome leaves a dead row version behind (and dead entries in the ready
indexes, which each claim walks past). Vacuum (PostgreSQL) or purge (InnoDB) removes them,
unless autovacuum is off or a transaction older than them is still open. Read by the overview,
so the database checks, ``tasks_status``, the admin's overview page and the metrics all say the
same thing with the same words.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import connections

from ..models import TaskRecord
from ..sql import TableHealth, dialect_for
from .durations import short
from .horizon import QUERY_SHOWN, horizon_holder, session

logger = logging.getLogger("django_sqltasks")

DEAD_ROWS_FLOOR = 10_000  # dead rows under this never warn: a vacuum is due soon anyway
# With autovacuum off, dead rows warn once they outnumber this share of the live ones: what
# autovacuum's default trigger (autovacuum_vacuum_scale_factor = 0.2) would not have let pile
# up. With it on, dead rows are judged against what autovacuum could have removed: a busy
# queue leaves tens of thousands behind between two of its rounds (about 14,800 beside 110
# live at 120 tasks/s, measured), which is healthy; what is not is that they outnumber the live
# ones and either a transaction older than the warning's age holds them (no vacuum may remove
# them) or autovacuum has not vacuumed the table for STALE_NAPTIMES of its rounds although
# they are past its trigger (it cannot keep up, or cannot get to the table).
DEAD_SHARE_AUTOVACUUM_OFF = 0.2
STALE_NAPTIMES = 5  # autovacuum_naptime periods (1 minute each by default)
# SQLite: a read transaction of another connection holds the WAL (W005) once the frames no
# checkpoint could copy pass this many rounds of wal_autocheckpoint (1,000 pages, about 4 MiB,
# by default: 10 make about 40 MiB). A short transaction holds a few pages at a time; at 30
# tasks/s the WAL grew by about 1.7 MiB a second while one was held (docs/databases.md).
WAL_HELD_CHECKPOINTS: float = 10
DEFAULT_WAL_AUTOCHECKPOINT = 1000  # pages: SQLite's, for a connection that turned it off
MIB = 1024 * 1024


@dataclass(frozen=True)
class HealthWarning:
    """One reason the task table's old rows are not being cleaned up."""

    check_id: str  # the system check that reports it
    code: str  # the metric's label
    message: str
    hint: str
    session: int | None = None  # the session it names (an old transaction's), if any

    @property
    def key(self) -> tuple[str, int | None]:
        """What makes it the same condition from one reading to the next."""
        return (self.check_id, self.session)


CODES = ("autovacuum_off", "dead_rows", "old_transaction")


def read(using: str = "default") -> TableHealth:
    """What database ``using`` says about the upkeep of its task table."""
    connection = connections[using]
    with connection.cursor() as cursor:
        return dialect_for(connection).table_health(cursor)


def warnings(health: TableHealth, using: str = "default") -> list[HealthWarning]:
    """The warnings ``health`` calls for, on database ``using``."""
    table = TaskRecord._meta.db_table
    found = []
    dead, live = health.dead_rows, health.live_rows
    if health.autovacuum is False:
        now = "" if dead is None else f" (about {dead:,} dead rows now)"
        where = " and ".join(
            "the server's autovacuum setting is off"
            if setting == "autovacuum"
            else "the table's autovacuum_enabled storage parameter is false"
            for setting in health.autovacuum_off_by
        )
        found.append(
            HealthWarning(
                "django_sqltasks.W003",
                "autovacuum_off",
                f"Autovacuum does not clean the task table {table} on database {using!r}: "
                f"{where}. Every claim and outcome leaves a dead row behind{now}, and claims "
                "slow down as they pile up.",
                "Turn it on ("
                + " and ".join(
                    "autovacuum = on in postgresql.conf"
                    if setting == "autovacuum"
                    else f"ALTER TABLE {table} RESET (autovacuum_enabled)"
                    for setting in health.autovacuum_off_by
                )
                + "), or VACUUM the table from cron every few minutes.",
            )
        )
    holder = horizon_holder(health)
    old = holder is not None and holder.old
    dialect = dialect_for(connections[using])
    ending, timeout = dialect.end_session, dialect.idle_transaction_timeout
    end_it = holder.end_it(ending, timeout) if holder is not None else ""
    if dead is not None and live is not None and dead > dead_rows_limit(health, live):
        more = "more dead rows than live ones" if dead > live else "many dead rows"
        message = (
            f"The task table {table} on database {using!r} holds {more} "
            f"(about {dead:,} dead, {live:,} live): claims walk past them."
        )
        if health.autovacuum is False and not old:
            found.append(
                HealthWarning(
                    "django_sqltasks.W004",
                    "dead_rows",
                    f"Dead rows are piling up in the task table {table} on database "
                    f"{using!r} (about {dead:,} dead, {live:,} live): autovacuum is off, so "
                    "nothing removes them, and every claim walks past their index entries.",
                    f"Turn autovacuum on (see W003), or run VACUUM {table} now; if it must stay "
                    f"off, schedule VACUUM {table} every few minutes (cron), and after each "
                    "tasks_prune, whose deleted rows stay dead until a vacuum.",
                )
            )
        elif old and holder is not None:
            # PostgreSQL reads only sessions whose snapshot or xid holds the horizon back.
            found.append(
                HealthWarning(
                    "django_sqltasks.W004",
                    "dead_rows",
                    f"{message} {holder.sentence} holds their cleanup back: no vacuum can "
                    "remove a row that died after it began, so they pile up until it ends.",
                    f"{end_it}; then run VACUUM {table}.",
                    session=holder.pid,
                )
            )
        elif vacuum_is_late(health):
            since = short(health.vacuumed_seconds_ago or 0)
            found.append(
                HealthWarning(
                    "django_sqltasks.W004",
                    "dead_rows",
                    f"{message} Autovacuum has not vacuumed it for {since}, although they are "
                    f"past its trigger (about {health.autovacuum_trigger or 0:,.0f} dead rows)"
                    + (f"; {holder.sentence} holds the horizon back." if holder else "."),
                    f"Run VACUUM {table}, and see why autovacuum does not get to it: its "
                    "workers busy with other tables (autovacuum_max_workers), its cost limit, or "
                    "its thresholds too high for this table (see docs/operations.md).",
                )
            )
    held = health.wal_held_frames
    if held is not None and held > wal_held_limit(health):
        page = health.wal_page_bytes or 0
        size = (
            ""
            if health.wal_bytes is None
            else f" (its -wal file is {health.wal_bytes / MIB:,.0f} MiB)"
        )
        found.append(
            HealthWarning(
                "django_sqltasks.W005",
                "old_transaction",
                f"A read transaction of another connection holds the WAL of database {using!r} "
                f"back: {held:,} pages written since it began ({held * page / MIB:,.0f} MiB) "
                f"cannot be checkpointed, and the WAL grows until it ends{size}. SQLite does "
                "not say which connection holds it.",
                "End that read transaction (a shell or a report left inside a transaction, a "
                "long loop over a queryset inside transaction.atomic()) and keep read "
                "transactions short; set PRAGMA journal_size_limit in the database's "
                "init_command so that the file shrinks again once the WAL is reset "
                "(see docs/databases.md).",
            )
        )
    if old and holder is not None:
        found.append(
            HealthWarning(
                "django_sqltasks.W005",
                "old_transaction",
                f"{holder.opened(using)}: until it ends, the dead rows of the task table "
                f"{table} cannot be cleaned up, and claims slow down.",
                f"{end_it}.",
                session=holder.pid,
            )
        )
    return found


def dead_rows_limit(health: TableHealth, live: int) -> float:
    """The dead rows past which W004 may warn: more than the live rows while autovacuum runs,
    DEAD_SHARE_AUTOVACUUM_OFF of them while it is off; never under DEAD_ROWS_FLOOR. With
    autovacuum on, W004 warns past it only if they cannot be removed or autovacuum is late."""
    share = DEAD_SHARE_AUTOVACUUM_OFF if health.autovacuum is False else 1.0
    return max(live * share, DEAD_ROWS_FLOOR)


def wal_held_limit(health: TableHealth) -> int:
    """The frames of SQLite's WAL a read transaction may keep from being checkpointed before
    W005 warns: WAL_HELD_CHECKPOINTS rounds of the connection's wal_autocheckpoint."""
    automatic = health.wal_autocheckpoint or 0
    pages = automatic if automatic > 0 else DEFAULT_WAL_AUTOCHECKPOINT
    return int(WAL_HELD_CHECKPOINTS * pages)


def vacuum_is_late(health: TableHealth) -> bool:
    """Whether autovacuum runs, the dead rows are past its trigger, and it has not vacuumed
    the table for STALE_NAPTIMES of its rounds (PostgreSQL's statistics say so)."""
    ago, trigger, naptime = (
        health.vacuumed_seconds_ago,
        health.autovacuum_trigger,
        health.autovacuum_naptime,
    )
    if health.autovacuum is not True or None in (ago, trigger, naptime, health.dead_rows):
        return False
    return bool(
        (health.dead_rows or 0) > (trigger or 0) and (ago or 0) > STALE_NAPTIMES * (naptime or 0)
    )


def one_line(text: str) -> str:
    """``text`` on one line: a driver's or a check's message may span several."""
    return " ".join(text.split())


def summary(health: TableHealth) -> str:
    """One line on the task table's upkeep, for ``tasks_status`` ("" if nothing is known)."""
    parts = []
    if health.autovacuum is not None:
        parts.append(
            "autovacuum on"
            if health.autovacuum
            else f"autovacuum OFF ({', '.join(health.autovacuum_off_by)})"
        )
    if health.live_rows is not None and health.dead_rows is not None:
        parts.append(f"about {health.live_rows:,} live and {health.dead_rows:,} dead rows")
    if health.history_length is not None:
        parts.append(f"InnoDB history length {health.history_length:,}")
    if health.wal_frames is not None:
        size = "" if health.wal_bytes is None else f" ({health.wal_bytes / MIB:,.1f} MiB)"
        parts.append(
            f"WAL {health.wal_frames:,} pages{size}, {health.wal_held_frames or 0:,} not "
            "checkpointed"
        )
    if health.vacuumed_seconds_ago is not None:
        parts.append(f"last vacuumed {short(health.vacuumed_seconds_ago)} ago")
    if health.oldest_transaction_seconds is not None:
        query = health.oldest_transaction_query
        parts.append(
            f"oldest other transaction {short(health.oldest_transaction_seconds)} "
            f"({session(health)}" + (f", query {query[:QUERY_SHOWN]!r})" if query else ")")
        )
    elif health.known and health.wal_frames is None:  # SQLite does not list transactions
        parts.append("no other transaction open")
    if health.prepared_gid is not None:
        parts.append(
            f"prepared transaction {health.prepared_gid!r} {short(health.prepared_seconds or 0)}"
        )
    if health.slot_name is not None:
        parts.append(
            f"replication slot {health.slot_name!r} xmin {health.slot_xids or 0:,} transactions old"
        )
    holder = horizon_holder(health)
    # Several kinds open at once: say which one holds the horizon furthest back.
    if holder is not None and (health.prepared_gid is not None or health.slot_name is not None):
        parts.append(f"horizon held by the {holder.kind} ({holder.name})")
    return "; ".join(parts)


class Watch:
    """Say once when each warning appears, and once when it clears: for a worker, which reads
    the task table's health now and then (``Maintenance``) and must not repeat itself."""

    def __init__(self, using: str) -> None:
        self.using = using
        self._current: dict[tuple[str, int | None], HealthWarning] = {}

    def update(self, found: list[HealthWarning]) -> list[HealthWarning]:
        """Log the warnings of ``found`` not seen at the last reading, and those gone since;
        return the new ones."""
        now = {warning.key: warning for warning in found}
        new = [warning for key, warning in now.items() if key not in self._current]
        # Those gone first: where another session now holds the horizon, the warning that
        # named the last one clears before the one that names the next.
        for key, warning in self._current.items():
            if key not in now:
                logger.info(
                    "%s cleared on database %r%s",
                    warning.check_id,
                    self.using,
                    "" if warning.session is None else f" (session {warning.session})",
                    extra={"action": "table_warning_cleared", "check_id": warning.check_id},
                )
        for warning in new:
            logger.warning(
                "%s: %s Hint: %s",
                warning.check_id,
                warning.message,
                warning.hint,
                extra={"action": "table_warning", "check_id": warning.check_id},
            )
        self._current = now
        return new
