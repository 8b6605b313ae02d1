"""The rows that cross into SQL and out of it: the columns each statement reads or writes, the
marks some columns carry, and the row types the dialects take and return."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from django.conf import settings

from ..core.serialization import loads

UTC = timezone.utc

# The columns a claim returns: a ClaimedRow's, in order.
RETURNED_COLUMNS = (
    "id",
    "task_path",
    "backend_name",
    "queue_name",
    "priority",
    "args",
    "kwargs",
    "enqueued_at",
    "run_after",
    "started_at",
    "last_attempted_at",
    "errors",
    "worker_ids",
    "attempts",
    "snoozes",
    "workflow_id",
    "trace_parent",
)
# The JSON columns a claim reads, and the type each must decode to.
JSON_SHAPES: dict[str, type] = {"args": list, "kwargs": dict, "errors": list, "worker_ids": list}
# An outcome's values, in the order a completion's statement reads them.
OUTCOME_COLUMNS = (
    "id",
    "status",
    "finished_at",
    "return_value",
    "error_class",
    "error_traceback",
    "available_at",
    "snoozed",
    "delay",
    "attempt",
)
# The columns an insert writes, in order.
INSERT_COLUMNS = (
    "id",
    "task_path",
    "backend_name",
    "queue_name",
    "priority",
    "status",
    "args",
    "kwargs",
    "errors",
    "worker_ids",
    "attempts",
    "enqueued_at",
    "run_after",
    "available_at",
    "dedupe_key",
    "limit_key",
    "trace_parent",
    "workflow_id",
    "tags",
)
# Every column of the task table, in the model's order: what reading one result selects, without
# the model (a test holds it to TaskRecord's concrete fields).
RESULT_COLUMNS = (
    "id",
    "task_path",
    "backend_name",
    "queue_name",
    "priority",
    "status",
    "args",
    "kwargs",
    "return_value",
    "errors",
    "worker_ids",
    "attempts",
    "rescues",
    "snoozes",
    "owner",
    "enqueued_at",
    "run_after",
    "available_at",
    "started_at",
    "last_attempted_at",
    "finished_at",
    "cancel_requested",
    "dedupe_key",
    "subject_type",
    "subject_id",
    "limit_key",
    "progress",
    "trace_parent",
    "workflow_id",
    "tags",
)
# available_at of a workflow step whose turn has not come: READY, but never due by a clock;
# the outcome of the step before it makes it due (store/workflows.py).
PARKED = datetime(9999, 1, 1, tzinfo=UTC)


def parked_at() -> datetime:
    """PARKED as Django reads and writes datetimes here: naive without USE_TZ."""
    return PARKED if settings.USE_TZ else PARKED.replace(tzinfo=None)


# available_at of a suspect: a task that was running when its worker died beside others, so
# any of them may have killed it. No claim by the clock takes it. A suspect of a first death
# (SUSPECT_TOGETHER) runs beside the others of its kind, in up to half of a worker's slots:
# most deaths (an OOM kill, a deploy's SIGKILL, a lost host) have no poison task, and those
# suspects then cost about one task's time per half-worker, not their sum. If its worker dies
# while it runs beside others again, it is not charged but becomes a SUSPECT: one that runs
# alone. A worker takes one SUSPECT at a time to run alone in one of its slots
# (claim_suspect), its other slots running other tasks, and it keeps this mark while it runs,
# so that if its worker dies again the rescue charges it (MAX_RESCUES). After its time bound
# (the lease timeout) a worker clears a suspect still running (SUSPECT_CLEARED) and may take
# the next one.
SUSPECT = datetime(9998, 1, 1, tzinfo=UTC)
# A suspect that runs alone until it ends, with no time bound: one whose worker died after it
# was cleared (a task that kills its worker only after its bound is then caught next time).
SUSPECT_UNBOUNDED = datetime(9998, 1, 2, tzinfo=UTC)
# available_at of a running suspect past its time bound: not charged if its worker dies (the
# next suspect may run beside it), and a suspect with no time bound after that.
SUSPECT_CLEARED = datetime(9998, 1, 3, tzinfo=UTC)
# A suspect of a first death, run beside other suspects of its kind (see SUSPECT); it keeps
# this mark while it runs, and a rescue then makes it a SUSPECT (charged only if it ran alone).
SUSPECT_TOGETHER = datetime(9998, 1, 4, tzinfo=UTC)
# The first date a run_after may not have: from here on the dates are marks (SUSPECT..PARKED).
RESERVED_FROM = SUSPECT


def stored(mark: datetime) -> datetime:
    """A mark as Django reads and writes datetimes here: naive without USE_TZ."""
    return mark if settings.USE_TZ else mark.replace(tzinfo=None)


def suspect_at() -> datetime:
    """SUSPECT as Django reads and writes datetimes here: naive without USE_TZ."""
    return stored(SUSPECT)


# The exception class paths that statements write into a task's errors: stored in rows, so
# these classes never move.
CORRUPT_TASK = "django_sqltasks.exceptions.CorruptTask"
OUTCOME_NOT_STORED = "django_sqltasks.exceptions.OutcomeNotStored"
WORKER_LOST = "django_sqltasks.exceptions.WorkerLost"
WORKER_STOPPED = "django_sqltasks.exceptions.WorkerStopped"


@dataclass(slots=True)
class TaskCall:
    """What a task row runs, where and when: the call as it was enqueued."""

    id: uuid.UUID
    task_path: str
    backend_name: str
    queue_name: str
    priority: int
    args: list[Any]
    kwargs: dict[str, Any]
    enqueued_at: datetime
    run_after: datetime | None


@dataclass(slots=True)
class NewTask(TaskCall):
    """A row to insert: arguments already checked and normalized."""

    args_json: str = ""  # args and kwargs encoded once, by the backend
    kwargs_json: str = ""
    dedupe_key: str | None = None
    limit_key: str | None = None
    trace_parent: str | None = None  # the enqueue span's W3C traceparent (OPTIONS["TRACING"])
    workflow_id: uuid.UUID | None = None  # the workflow this task is a step of
    tags: tuple[str, ...] = ()  # its labels (core/tags.py); none is stored as NULL
    # When it is due, if not run_after (or the database's clock): a workflow step parks at
    # PARKED until its turn, and its first steps are due by the database's clock, read once.
    available_at: datetime | None = None


ANY_LIMIT = "*any*"  # Scope.limit_key: limited or not (the testing runner's in-process claim)


@dataclass(frozen=True, slots=True)
class Scope:
    """Which READY tasks a claim may take besides their queues: those of no limit (the main
    claim), those of one limit key, or (``ANY_LIMIT``) all; never those of ``exclude_queues``
    (the limited queues, which the limited claim takes)."""

    limit_key: str | None = None
    exclude_queues: tuple[str, ...] = ()
    # Only tasks of this priority (None: of any): the fair claim takes one priority at a time.
    priority: int | None = None


UNLIMITED = Scope()


@dataclass(frozen=True, slots=True)
class SuspectRow:
    """A suspect waiting to run alone (see SUSPECT): what its claim needs to know first."""

    id: uuid.UUID
    bounded: bool  # whose worker clears it after its time bound (SUSPECT, not _UNBOUNDED)
    limit_key: str | None
    queue_name: str
    together: bool = False  # of a first death: runs beside others (SUSPECT_TOGETHER)


@dataclass(slots=True)
class ClaimedRow(TaskCall):
    """A task a worker has just claimed, with the values the claim wrote."""

    started_at: datetime
    last_attempted_at: datetime
    errors: list[dict[str, str]]
    worker_ids: list[str]
    attempts: int
    snoozes: int = 0  # how many times it snoozed before this attempt
    workflow_id: uuid.UUID | None = None  # the workflow it is a step of, if any
    # Why the stored row cannot be run (JSON that does not parse or has the wrong shape).
    corrupt: str | None = None
    trace_parent: str | None = None  # the enqueue span's W3C traceparent, if it was traced
    # The id as the claim returned it, where that is its canonical text (PostgreSQL's): the
    # RUNNING TaskResult's id without formatting the UUID again. "" where it is not.
    text_id: str = ""


@dataclass(slots=True)
class Outcome:
    """How an attempt ended: SUCCESSFUL with a JSON return value, or FAILED with one error."""

    id: uuid.UUID
    status: str
    finished_at: datetime | None
    return_value: str | None  # encoded JSON, or None for SQL NULL
    error_class: str | None = None  # the failed attempt's exception class path
    error_traceback: str | None = None
    available_at: datetime | None = None  # for a retry (status READY): when to run again
    # 1 for a snooze (status READY): the attempt is given back and a snooze counted instead.
    snoozed: int = 0
    # For a retry or a snooze (status READY): seconds after the write, by the database's
    # clock, when it runs again (a worker's own clock may be off). available_at wins if set.
    delay: float | None = None
    # The workflow of a task that is one of its steps: its final outcome moves it on, in the
    # transaction that stores it. Not a column of the outcome's write.
    workflow_id: uuid.UUID | None = None
    # The attempt number of the claim this outcome ends: it is stored only while the row is
    # still that claim, so that a stale writer's outcome (a process that lost its claim, its
    # task claimed again under the same worker id) matches nothing. None: the owner alone
    # guards it (a supervisor ending a killed process's tasks).
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class TableHealth:
    """What the database says about the upkeep of the task table; None where it says nothing
    (SQLite has no vacuum horizon to hold back, nor dead rows that slow a claim)."""

    autovacuum: bool | None = None  # whether autovacuum may clean the task table
    autovacuum_off_by: tuple[str, ...] = ()  # the settings that turn it off, if it is off
    live_rows: int | None = None  # the statistics' estimates, not counts
    dead_rows: int | None = None
    # The oldest transaction of another session that holds back the cleanup of old rows.
    oldest_transaction_seconds: float | None = None
    oldest_transaction_pid: int | None = None  # its backend pid or connection id
    oldest_transaction_state: str | None = None
    oldest_transaction_application: str | None = None  # its application_name (PostgreSQL)
    oldest_transaction_query: str | None = None  # the start of its current or last statement
    # PostgreSQL: how many transactions (xids) ago its snapshot or xid began: what makes it,
    # or the prepared transaction or the replication slot below, the horizon's holder.
    oldest_transaction_xids: int | None = None
    history_length: int | None = None  # InnoDB: undo records not yet purged
    # PostgreSQL: since when the live partition was last vacuumed (by autovacuum or by hand;
    # since the server started if never), the dead rows past which autovacuum vacuums it,
    # and how often autovacuum looks (autovacuum_naptime), in seconds.
    vacuumed_seconds_ago: float | None = None
    autovacuum_trigger: float | None = None
    autovacuum_naptime: float | None = None
    # PostgreSQL: the oldest prepared transaction of this database (pg_prepared_xacts), and
    # the replication slot with the oldest xmin (pg_replication_slots): both hold the horizon
    # back as a session does, and no session timeout ends them.
    prepared_gid: str | None = None
    prepared_seconds: float | None = None
    prepared_owner: str | None = None
    prepared_xids: int | None = None
    slot_name: str | None = None
    slot_xids: int | None = None
    # SQLite in WAL mode, after a passive checkpoint: the -wal file's size, the frames (pages)
    # it holds, those no checkpoint could copy into the database (written after the snapshot of
    # another connection's read transaction began: it keeps the WAL from being reset), and the
    # size of a page and the connection's wal_autocheckpoint (in pages).
    wal_bytes: int | None = None
    wal_frames: int | None = None
    wal_held_frames: int | None = None
    wal_page_bytes: int | None = None
    wal_autocheckpoint: int | None = None

    @property
    def known(self) -> bool:
        """Whether the database reported anything."""
        return any(getattr(self, name) not in (None, ()) for name in self.__slots__)


def json_column(column: str, value: Any, *, decoded: bool, problems: list[str]) -> Any:
    """A JSON column's value, decoded and of its JSON_SHAPES type; or, if it is not, an empty
    one, with the problem added to ``problems``."""
    kind = JSON_SHAPES[column]
    if not decoded:
        try:
            value = loads(value)
        except (ValueError, TypeError, RecursionError) as e:
            # orjson also refuses nesting deeper than 1024 levels: such a row fails alone.
            problems.append(f"column {column} holds text that cannot be decoded as JSON ({e})")
            return kind()
    if not isinstance(value, kind):
        problems.append(
            f"column {column} holds a JSON {type(value).__name__}, not a "
            f"{'list' if kind is list else 'object'}"
        )
        return kind()
    return value
