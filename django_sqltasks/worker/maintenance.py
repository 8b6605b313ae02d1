"""The worker's upkeep, each on a thread of its own so a busy event loop cannot starve it: the
heartbeat, which runs the services of ``worker/upkeep/`` that are due (lease renewal and
rescue, cancel requests, suspects, the workflow sweep, the task table's health, the days of
partitions ahead, pruning), and the periodic scheduler. The heartbeat's queries run on the
worker's database thread; the scheduler's on a connection of its own (see ``_schedule_loop``)."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

from django.db import connections

from ..sql.retries import run_with_retries
from ..store.pruning import Retention
from . import events
from .lease import Lease
from .liveness import FailingRoles
from .reporter import Reporter
from .scheduler import Scheduler
from .upkeep import Service
from .upkeep.cancels import CancelRequests
from .upkeep.partition_days import PartitionDays
from .upkeep.pruning import Pruning
from .upkeep.renewal import Renewal
from .upkeep.schedules import Schedules
from .upkeep.suspects import Suspects
from .upkeep.table_health import TableHealth
from .upkeep.workflows import WorkflowSweep

logger = logging.getLogger("django_sqltasks")

T = TypeVar("T")

# Seconds between two readings of the task table's health (dead rows, autovacuum, an old
# transaction holding cleanup back): two cheap statements on PostgreSQL's statistics views
# (about 1 ms), two on MariaDB's information_schema, none on SQLite. A minute: the age past
# which an old transaction is warned of (SQLTASKS_OLD_TRANSACTION_SECONDS' default).
HEALTH_INTERVAL = 60.0
# Seconds between two looks at the partitions of finished tasks ahead (PostgreSQL): a
# catalog read, and a few DDL statements once a day. Days are made DAYS_AHEAD ahead, so an
# hour late is never late.
PARTITIONS_INTERVAL = 3600.0


class Maintenance:
    """Start and stop the heartbeat and periodic threads of one worker.

    Everything here is set before ``start()`` and only read afterwards, but for the threads,
    which this object's ``start()`` and ``join()`` own (the loop thread calls both).
    """

    def __init__(
        self,
        *,
        backend: Any,
        lease: Lease,
        db: Executor,
        failing: FailingRoles,
        stopped: threading.Event,
        on_cancel_requested: Callable[[list[uuid.UUID]], None],
        on_suspects: Callable[[], None] | None = None,
        on_beat: Callable[[bool], None] | None = None,
        reporter: Reporter | None = None,
        shared_thread: bool = False,
        single_writer: bool = False,
    ) -> None:
        self.backend = backend
        self.database: str = backend.database
        self.lease = lease
        self.interval: float = backend.config.heartbeat_interval
        self._db = db
        self._failing = failing
        self._stopped = stopped  # set by the runner: the threads end
        self._scheduling = threading.Event()  # set while periodic tasks may be enqueued
        self._threads: list[threading.Thread] = []
        self._renewal = Renewal(lease, on_beat=on_beat, reporter=reporter)
        # The heartbeat's services, in the order each beat runs those due.
        self.services: list[Service] = [
            self._renewal,
            CancelRequests(lease, on_cancel_requested),
        ]
        if on_suspects is not None:  # told when suspects wait (see Producer.on_suspects)
            self.services.append(Suspects(lease, on_suspects))
        self.services += [
            # Once a LEASE_TIMEOUT, the time scale of the rescues it catches up with.
            WorkflowSweep(
                database=self.database, backend_name=backend.alias, interval=lease.timeout
            ),
            TableHealth(database=self.database, interval=HEALTH_INTERVAL),
            PartitionDays(database=self.database, interval=PARTITIONS_INTERVAL),
        ]
        retention = Retention.for_backend(backend)  # PRUNE_*_DAYS, or None
        if retention is not None:
            self.services.append(Pruning(retention))
        # One writer at a time (SQLite): the scheduler's statements go through the database
        # thread. Elsewhere on a connection of the periodic thread's own, kept between ticks
        # (MariaDB, MySQL), or, where the worker keeps to two connections (PostgreSQL: the
        # runner's ``shares_database_thread``), opened for a tick and closed after it.
        self._single_writer = single_writer
        self._tick_connection = shared_thread and not single_writer

    def start(self) -> None:
        """Start the threads (the lease was just taken: a renewal for ``on_beat``)."""
        self._renewal.report(True)
        self._scheduling.set()
        for target, name in (
            (self._heartbeat_loop, "sqltasks-heartbeat"),
            (self._schedule_loop, "sqltasks-periodic"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop_scheduling(self) -> None:
        """Enqueue no more periodic tasks (a stopping worker takes no new work)."""
        self._scheduling.clear()

    def join(self) -> None:
        """Wait for the threads, once ``stopped`` is set."""
        for thread in self._threads:
            thread.join(timeout=self.interval + 5)

    # Heartbeat thread ---------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while not self._stopped.wait(self.interval):
            self.beat()

    def beat(self) -> None:
        """Renew the lease (unless this worker is stuck), then run the other services due."""
        stalled = self._failing.stalled(self.lease.timeout)
        if stalled:
            # A worker that can neither claim nor write outcomes must let its tasks go: a
            # healthy worker rescues them once this lease runs out.
            logger.error(
                "Not renewing the lease of worker_id=%s: %s; its tasks will be rescued by "
                "another worker",
                self.lease.worker_id,
                ", ".join(f"{role} has failed for {seconds:.0f}s" for role, seconds in stalled),
                extra={"action": "lease_withheld", "worker_id": self.lease.worker_id},
            )
            self._renewal.report(False)
            return
        for service in self.services:
            if service.due():
                service.run(self._guarded)

    def _guarded(self, what: str, fn: Callable[[], T]) -> T | None:
        """Run ``fn`` on the database thread, riding out transient errors; log any other."""
        try:
            return self._db.submit(run_with_retries, self.database, fn, self._stopped).result()
        except Exception:
            logger.exception("%s failed worker_id=%s", what, self.lease.worker_id)
            return None

    # Periodic thread ----------------------------------------------------------------------

    def _schedule_loop(self) -> None:
        """Enqueue periodic tasks at their slots: a thread that ticks at the next slot, and at
        least once a HEARTBEAT_INTERVAL, reading the schedule table's due rows each time (so a
        schedule added, changed or disabled in the admin holds from the next tick).

        Its statements run on a connection of its own, so that no table of schedules, however
        large, holds up the heartbeat, the outcomes or the claims of the database thread (on
        PostgreSQL a tick's connection is closed after it: the worker holds two between
        ticks); on a database that takes one writer at a time (SQLite) they go through the
        database thread, one batch of rows at a time, so that a heartbeat waits for one batch
        at most.
        """
        schedules = Schedules(Scheduler(self.backend), interval=self.interval)
        run = self._guarded if self._single_writer else self._guarded_here
        try:
            while self._scheduling.is_set():
                tick = schedules.tick(run)
                if self._tick_connection:
                    connections.close_all()  # taken for the tick only
                events.emit("scheduler_tick", worker_id=self.lease.worker_id, fired=tick.fired)
                if self._stopped.wait(tick.delay):
                    return
            events.emit("scheduling_stopped", worker_id=self.lease.worker_id)
        finally:
            if not self._single_writer:
                connections.close_all()  # this thread's own

    def _guarded_here(self, what: str, fn: Callable[[], T]) -> T | None:
        """``_guarded``, on this thread's own connection."""
        try:
            return run_with_retries(self.database, fn, self._stopped)
        except Exception:
            logger.exception("%s failed worker_id=%s", what, self.lease.worker_id)
            return None
