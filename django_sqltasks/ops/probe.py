"""The health probe behind ``manage.py tasks_health``: can anything run at all (a backend of
this package configured and loadable, its tables migrated, its database reachable and
writable), is some worker alive, is every queue served, has the oldest due task waited too
long, does a transaction hold back the cleanup of the task table, and are the claims slow.

Its cost does not grow with the backlog or the history: it reads the worker table, and each
queue's oldest due task with one probe of a ready index per priority (``oldest_ready``), the
tasks under a limit with one bounded range of theirs; finished tasks are never read. Every
statement runs under a time limit (statements and lock waits), so that a table locked by a
migration or a server that stalls gets an answer with one of its codes, never a hang. It
judges by the database's clock, as the workers judge each other.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction

from ..core.backends import SQLBackend
from ..models import PausedQueue, TaskRecord, WorkerRecord
from ..sql import dialect_for
from ..sql.installation import is_missing_table, not_migrated, unapplied_migrations, unreachable
from ..sql.lists import ready_queue_names
from . import health as table_health
from .claims import (
    judged,
    of_backend,
    published,
)
from .health import one_line
from .horizon import Holder, horizon_holder
from .probe_report import BackendHealth, Exit, Limits, Problem, QueueHealth, Report

# The due tasks under a limit read, earliest first: each queue among them gets its exact
# oldest; a queue whose first is further back has waited less than the last one read.
LIMITED_READ = 100


class OutOfTime(Exception):
    """The probe's time on a database ran out between two statements."""


def probe(
    backends: list[SQLBackend], queues: list[str] | None = None, limits: Limits | None = None
) -> Report:
    """Check each backend: its tables, its database, a live worker, every queue served, no
    due task older than ``limits.max_age``, no transaction holding back the task table's
    cleanup for over ``limits.max_transaction_age``, the live workers' claims no slower than
    ``limits.max_claim_mean`` on average (a warning past ``warn_claim_mean``). ``queues``
    (default: the backend's QUEUES and every queue with a due task) narrows the queues
    checked."""
    limits = limits or Limits()
    report = Report([], [])
    horizons: dict[str, Holder | None] = {}  # per database, read once
    for backend in backends:
        health = BackendHealth(backend.alias, backend.database)
        report.backends.append(health)
        try:
            report.problems.extend(_check(backend, health, queues, limits, report, horizons))
        except (DatabaseError, OutOfTime) as e:
            problem = failure(backend, e, limits)
            health.reachable = problem.exit != Exit.DATABASE_UNREACHABLE
            report.problems.append(problem)
    return report


def failure(backend: SQLBackend, error: Exception, limits: Limits) -> Problem:
    """The problem that ``error``, raised while the probe read ``backend``'s database, is."""
    using, alias = backend.database, backend.alias
    dialect = dialect_for(connections[using])
    if isinstance(error, OutOfTime) or dialect.is_timeout(error):
        detail = "" if isinstance(error, OutOfTime) else f" ({one_line(str(error))})"
        return Problem(
            Exit.DATABASE_UNREACHABLE,
            alias,
            f"Database {using!r} did not answer within {limits.timeout:g}s (--timeout): a "
            f"statement waited for a lock (a migration, a LOCK TABLE) or ran too long{detail}.",
            code="database_timeout",
        )
    if is_missing_table(error):
        return Problem(Exit.MISCONFIGURED, alias, not_migrated(using), code="not_migrated")
    if isinstance(error, (OperationalError, InterfaceError)):  # a refused or lost connection
        return Problem(Exit.DATABASE_UNREACHABLE, alias, one_line(unreachable(using, error)))
    return Problem(
        Exit.DATABASE_UNREACHABLE,
        alias,
        f"Database {using!r} refused the probe's reads: {one_line(str(error))}",
        code="database_error",
    )


def _check(
    backend: SQLBackend,
    health: BackendHealth,
    queues: list[str] | None,
    limits: Limits,
    report: Report,
    horizons: dict[str, Holder | None],
) -> list[Problem]:
    using, alias = backend.database, backend.alias
    connection = connections[using]
    dialect = dialect_for(connection)
    dialect.limit_connect(limits.timeout)
    deadline = time.monotonic() + limits.timeout

    def left() -> float:
        seconds = deadline - time.monotonic()
        if seconds <= 0:
            raise OutOfTime
        return seconds

    # Reads, and one write that changes nothing, in one transaction: each statement given
    # what is left of the probe's time on this database.
    with transaction.atomic(using=using), connection.cursor() as cursor:
        saved = dialect.save_time_limits(cursor)
        try:
            dialect.limit_time(cursor, left())
            unapplied = unapplied_migrations(using)
            if unapplied:
                return [
                    Problem(
                        Exit.MISCONFIGURED,
                        alias,
                        not_migrated(using, unapplied),
                        code="not_migrated",
                    )
                ]
            problems = _workers_and_queues(backend, health, queues, limits.max_age, cursor)
            problems += _claims(backend, health, limits, report)
            dialect.limit_time(cursor, left())
            if using not in horizons:
                horizons[using] = _horizon(backend, limits, report, problems)
            health.holder = horizons[using]
            dialect.limit_time(cursor, left())
            try:
                with transaction.atomic(using=using):  # a savepoint: its error undone alone
                    dialect.write_nothing(cursor)
            except DatabaseError as e:
                if not dialect.is_read_only(e):
                    raise
                problems.insert(
                    0,
                    Problem(
                        Exit.DATABASE_UNREACHABLE,
                        alias,
                        f"Database {using!r} takes no writes ({one_line(str(e))}): no worker can "
                        "claim a task or send a heartbeat (a standby, default_transaction_read_only"
                        ", a read-only file or server).",
                        code="database_read_only",
                    ),
                )
        finally:
            dialect.restore_time_limits(cursor, saved)
    return problems


def _horizon(
    backend: SQLBackend, limits: Limits, report: Report, problems: list[Problem]
) -> Holder | None:
    """Read the task table's upkeep on ``backend``'s database: its warnings go in ``report``,
    a holder of the horizon older than ``limits.max_transaction_age`` in ``problems``."""
    using = backend.database
    upkeep = table_health.read(using)
    report.warnings.extend(table_health.warnings(upkeep, using))
    holder = horizon_holder(upkeep)
    for health in report.backends:
        if health.database == using:
            health.upkeep = table_health.summary(upkeep)
    if holder is not None and (holder.seconds or 0) > limits.max_transaction_age:
        problems.append(
            Problem(
                Exit.HORIZON_HELD,
                backend.alias,
                f"{holder.opened(using)}, over the {limits.max_transaction_age:g}s allowed "
                "(--max-transaction-age): until it ends, no dead row of the task table that "
                "died after it began can be removed, and each claim walks past more of them.",
                code="horizon_held",
            )
        )
    return holder


def _workers_and_queues(
    backend: SQLBackend,
    health: BackendHealth,
    queues: list[str] | None,
    max_age: float,
    cursor: Any,
) -> list[Problem]:
    using, alias = backend.database, backend.alias
    dialect = dialect_for(connections[using])
    now = dialect.db_now(cursor)
    lease = timedelta(seconds=backend.config.lease_timeout)
    rows = WorkerRecord.objects.using(using).filter(backend_name=alias)
    live = list(rows.filter(heartbeat_at__gte=now - lease).order_by("id"))
    workers = [(w.id, w.queue_names) for w in live]
    health.live_workers = [worker_id for worker_id, _ in workers]
    health.claims = of_backend([published(w, now, lease.total_seconds()) for w in live])
    served: set[str] = {name for _, names in workers for name in names}
    oldest = oldest_due(using, alias, now, [*backend.queues], queues, health)
    paused = set(
        PausedQueue.objects.using(using)
        .filter(backend_name=alias)
        .values_list("queue_name", flat=True)
    )
    names = queues if queues is not None else sorted({*backend.queues, *oldest})
    problems: list[Problem] = []
    if not workers:
        last = rows.order_by("-heartbeat_at").values_list("id", "hostname", "pid", "heartbeat_at")
        problems.append(
            Problem(
                Exit.NO_LIVE_WORKER,
                alias,
                f"No live worker of backend {alias!r}: none has sent a heartbeat in the last "
                f"{lease.total_seconds():g}s (LEASE_TIMEOUT)." + _last_heartbeat(last.first(), now),
            )
        )
    for name in names:
        due_at = oldest.get(name)
        age = None if due_at is None else max((now - due_at).total_seconds(), 0.0)
        queue = QueueHealth(name, "*" in served or name in served, name in paused, age)
        health.queues.append(queue)
        if workers and not queue.served:
            problems.append(
                Problem(
                    Exit.QUEUE_UNSERVED,
                    alias,
                    f"Queue {name!r} of backend {alias!r} is served by no live worker.",
                    queue=name,
                )
            )
        if age is not None and age > max_age and not queue.paused:
            problems.append(
                Problem(
                    Exit.BACKLOG_TOO_OLD,
                    alias,
                    f"The oldest due task of queue {name!r} of backend {alias!r} has waited "
                    f"{age:.0f}s, over the {max_age:g}s allowed (--max-age).",
                    queue=name,
                )
            )
    return problems


def _claims(
    backend: SQLBackend, health: BackendHealth, limits: Limits, report: Report
) -> list[Problem]:
    """Warn of the live workers' recent claims past ``limits.warn_claim_mean`` on average, and
    fail past ``limits.max_claim_mean``; say nothing of a cost no worker published."""
    if health.claims is None:
        return []
    warning, failed = judged(
        backend.alias, health.claims, limits.warn_claim_mean, limits.max_claim_mean
    )
    if warning is not None:
        report.warnings.append(warning)
    return [] if failed is None else [Problem(Exit.CLAIM_SLOW, backend.alias, failed)]


def _last_heartbeat(row: tuple[str, str, int | None, datetime] | None, now: datetime) -> str:
    """Which worker sent the last heartbeat, and when: one that stopped without removing its
    row (killed), or is wedged (stopped by SIGSTOP, its heartbeat thread stuck)."""
    if row is None:
        return ""
    worker_id, hostname, pid, heartbeat_at = row
    where = ", ".join(part for part in (hostname, f"pid {pid}" if pid else "") if part)
    ago = max((now - heartbeat_at).total_seconds(), 0.0)
    return (
        f" The last, worker {worker_id!r}" + (f" ({where})" if where else "") + f", sent its "
        f"{ago:.0f}s ago: it stopped without removing its row, or is wedged (stopped by a "
        "signal, its heartbeat thread stuck)."
    )


def oldest_due(
    using: str,
    alias: str,
    now: datetime,
    configured: list[str],
    queues: list[str] | None = None,
    health: BackendHealth | None = None,
) -> dict[str, datetime]:
    """The earliest ``available_at`` of the due tasks of each queue of backend ``alias``: of
    ``queues``, or (None) of the ``configured`` ones and every queue holding a READY task.

    Per queue, one probe of ``sqltasks_ready_idx`` per priority (``oldest_ready``); the
    queues holding READY tasks, one probe per queue (``ready_queue_names``); the tasks under a
    limit, the LIMITED_READ earliest due through ``sqltasks_ready_limited_at_idx``. Finished
    tasks, and the due tasks behind each queue's oldest, are never read.
    """
    dialect = dialect_for(connections[using])
    names = queues
    if names is None:
        names = sorted({*configured, *ready_queue_names(TaskRecord.objects.using(using), alias)})
    oldest: dict[str, datetime] = {}
    with connections[using].cursor() as cursor:
        for name in names:
            at = dialect.oldest_ready(cursor, alias, name)
            if at is not None and at <= now:
                oldest[name] = at
        limited = dialect.oldest_limited(cursor, alias, LIMITED_READ)
    for name, at in limited:
        if queues is None or name in queues:
            oldest[name] = min(at, oldest.get(name, at))
    if len(limited) == LIMITED_READ and health is not None:
        last = max((now - limited[-1][1]).total_seconds(), 0.0)
        health.notes.append(
            f"Of the due tasks under a limit, the {LIMITED_READ} earliest were read: a queue "
            f"none of them is in has none that waited longer than {last:.0f}s."
        )
    return oldest
