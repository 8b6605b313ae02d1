"""The runner: a worker's wiring, its start and stop, and the OS signals that stop it.

The roles it wires, each in a module of its own: the producer claims and starts tasks, the
executor runs them, the completer writes their outcomes, and the maintenance threads keep the
lease and run periodic tasks. docs/worker.md describes their threads and what each owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.db import DatabaseError, connections

from ..backend import SQLTaskBackend
from ..compat import task_backends
from ..core.articles import a_or_an
from ..core.backends import is_sql_backend
from ..sql import dialect_for
from ..sql.prepared import worker_thread
from . import events
from .checks import check_arguments, check_database, default_worker_id
from .claim_meter import ClaimMeter
from .claims import Claims
from .completer import Completer
from .executor import Executor, TaskWatch
from .lease import Lease
from .listeners import Listeners
from .liveness import FailingRoles
from .loop import run as event_loop_run
from .main_claim import MainClaim
from .maintenance import Maintenance
from .native import LoopDatabase
from .producer import Producer
from .reporter import Reporter
from .retries import DatabaseThread
from .slots import Slots
from .threads import ReceiverThread, TaskThreads

logger = logging.getLogger("django_sqltasks")

WRITES_WAIT = 30.0  # seconds a stopping worker waits for its outcomes to be written


class Worker:
    """Run tasks of one backend's queues until stopped, or until no task is left (``burst``)."""

    def __init__(
        self,
        *,
        backend: str = "default",
        queue_names: list[str] | None = None,
        concurrency: int = 10,
        burst: bool = False,
        max_tasks: int | None = None,
        worker_id: str | None = None,
        poll_interval: float | None = None,
        shutdown_timeout: float | None = None,
        prefetch: int | None = None,
        on_beat: Callable[[bool], None] | None = None,
        supervisor: TaskWatch | None = None,
        relay_fd: int | None = None,
    ) -> None:
        task_backend = task_backends[backend]
        if not is_sql_backend(task_backend):
            raise ValueError(
                f"Backend {backend!r} is {a_or_an(type(task_backend).__qualname__)}, not a "
                "django_sqltasks SQLTaskBackend: this worker only runs its tasks."
            )
        assert isinstance(task_backend, SQLTaskBackend)  # for the type checker
        check_arguments(
            concurrency, prefetch, max_tasks, poll_interval, shutdown_timeout, worker_id
        )
        # Set once here; read from any thread.
        self.backend = task_backend
        self.database = task_backend.database
        self.queue_names = None if queue_names is None or "*" in queue_names else queue_names
        self.concurrency = concurrency
        # Tasks claimed beyond the free slots, started as slots free up: a finished task's slot
        # is filled at once instead of after the next claim's round trip.
        self.prefetch = concurrency // 4 if prefetch is None else prefetch
        self.worker_id = worker_id or default_worker_id()
        self.shutdown_timeout = shutdown_timeout
        config = task_backend.config
        # What the claims cost: timed where they run, published by the heartbeat.
        self.claim_meter = ClaimMeter(
            full_passes=dialect_for(connections[self.database]).claims_from_marks
        )
        self.lease = Lease(
            worker_id=self.worker_id,
            backend_name=task_backend.alias,
            database=self.database,
            queue_names=self.queue_names,
            concurrency=concurrency,
            timeout=config.lease_timeout,
            max_rescues=config.max_rescues,
            claims=self.claim_meter,
        )
        self._stopped = threading.Event()  # set when the worker winds down: threads end
        self._failing = FailingRoles()
        # Set by whichever of the worker's connections is lost first: the next claim puts
        # back what the database (after a failover, another server) says this worker holds
        # and it does not (see Claims.connection_lost).
        self._connection_lost = threading.Event()
        self._db = DatabaseThread(
            self.database, self._stopped, self._connection_lost, config.direct_sessions
        )
        # One connection of the worker's own besides the loop's (docs/worker.md, "Database
        # connections"): outcomes go through the database thread where
        # the main claim runs on the loop (PostgreSQL), or where the database takes one writer
        # at a time (SQLite). MariaDB and MySQL claim on the database thread: outcomes are
        # written on a connection of their own there, so that a claim and a write overlap.
        self._shared_thread = shares_database_thread(self.database)
        self._writer = (
            self._db.executor
            if self._shared_thread
            else ThreadPoolExecutor(
                1,
                thread_name_prefix="sqltasks-writer",
                initializer=worker_thread if config.direct_sessions else None,
            )
        )
        self._threads = TaskThreads(concurrency)
        self._receivers = ReceiverThread()  # its thread starts with the loop
        self.slots = Slots(concurrency, self.prefetch)
        self._completer = Completer(
            database=self.database,
            worker_id=self.worker_id,
            executor=self._writer,
            receivers=self._receivers,
            sender=type(task_backend),
            failing=self._failing,
            stopping=self._stopped,
            shared=self._shared_thread,
        )
        self._claims = Claims(
            backend=task_backend,
            worker_id=self.worker_id,
            queue_names=self.queue_names,
            slots=self.slots,
            completer=self._completer,
            connection_lost=self._connection_lost,
            meter=self.claim_meter,
        )
        self._poll_interval: float = poll_interval or config.poll_interval
        self._main_claim = MainClaim(self._claims, self._db)
        self._producer = Producer(
            sender=type(task_backend),
            claims=self._claims,
            main_claim=self._main_claim,
            slots=self.slots,
            db=self._db,
            completer=self._completer,
            failing=self._failing,
            poll_interval=self._poll_interval,
            burst=burst,
            max_tasks=max_tasks,
            suspect_bound=config.lease_timeout,
        )
        self._completer.on_ready_again = self._producer.on_ready_again
        self._reporter = Reporter(
            database=self.database, worker_id=self.worker_id, db=self._db.executor
        )
        self._maintenance = Maintenance(
            backend=task_backend,
            lease=self.lease,
            db=self._db.executor,
            failing=self._failing,
            stopped=self._stopped,
            on_cancel_requested=self._producer.on_cancel_requested,
            on_suspects=self._producer.on_suspects,
            on_beat=on_beat,
            reporter=self._reporter,
            shared_thread=self._shared_thread,
            single_writer=dialect_for(connections[self.database]).single_writer,
        )
        self._supervisor = supervisor  # None unless run by tasks_worker --processes
        self._listeners = Listeners(
            backend=task_backend,
            claims=self._claims,
            main_claim=self._main_claim,
            producer=self._producer,
            poll_interval=self._poll_interval,
            connection_lost=self._connection_lost,
            meter=self.claim_meter,
            relay_fd=relay_fd,
        )
        # Owned by the loop thread.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: Executor | None = None

    # Public controls --------------------------------------------------------------------

    def run(self) -> None:
        """Run until stopped; install SIGINT/SIGTERM handlers when on the main thread."""
        event_loop_run(self._main())

    def stop(self) -> None:
        """Stop claiming and let running tasks finish; safe to call from any thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(self._begin_stop)
                return
        self._producer.stop()  # before the loop runs: it will not claim

    def force_stop(self) -> None:
        """Write what is finished, put running tasks back in the queue, and exit now."""
        logger.warning("Forced stop worker_id=%s: requeueing running tasks", self.worker_id)

        def requeue() -> None:
            try:
                self._completer.wait_idle(timeout=2)
                self._claims.requeue_owned("The worker was forced to stop while this task ran.")
            except Exception:
                logger.exception("Could not requeue tasks of worker_id=%s", self.worker_id)
            finally:
                connections.close_all()

        # Django refuses blocking database calls on a thread running an event loop.
        thread = threading.Thread(target=requeue, name="sqltasks-force-stop", daemon=True)
        thread.start()
        thread.join(timeout=5)
        logging.shutdown()
        os._exit(1)

    def check_database(self) -> None:
        """Check the server version and the task table on the connection the worker will use;
        raise ``RuntimeError`` saying what is wrong."""
        self._db.executor.submit(check_database, self.database).result()

    @property
    def claimed(self) -> int:
        """Tasks claimed since the worker started."""
        return self.slots.claimed

    @property
    def processed(self) -> int:
        """Task outcomes written since the worker started."""
        return self._completer.written

    @property
    def running(self) -> int:
        """Claimed tasks whose function has not returned yet."""
        return self.slots.held

    @property
    def abandoned(self) -> bool:
        """Whether the shutdown timeout left tasks running (they were requeued)."""
        return self._executor is not None and self._executor.abandoned

    # Start and stop (the loop thread) ---------------------------------------------------

    async def _main(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._receivers.start()
        self._executor = Executor(
            backend=self.backend,
            loop=loop,
            threads=self._threads,
            receivers=self._receivers,
            completer=self._completer,
            done=self._producer.task_done,
            suspended=self.slots.suspended,
            supervisor=self._supervisor,
            reporter=self._reporter,
        )
        self._producer.attach(loop, self._executor)
        self._install_signal_handlers()
        if not self._shared_thread:
            # Connect the outcome writer while the worker registers: the first outcome is
            # written sooner.
            self._writer.submit(_connect, self.database)
        await self._db.call(self.lease.register)
        await self._listeners.start()
        self._maintenance.start()
        logger.info(
            "Worker started worker_id=%s backend=%s database=%s queues=%s concurrency=%d",
            self.worker_id,
            self.backend.alias,
            self.database,
            ",".join(self.queue_names) if self.queue_names else "*",
            self.concurrency,
            extra={"action": "worker_start", "worker_id": self.worker_id},
        )
        events.emit("worker_started", worker_id=self.worker_id)
        try:
            await self._producer.run()
            self._maintenance.stop_scheduling()
            await self._drain()
        finally:
            await self._shut_down()

    async def _shut_down(self) -> None:
        """Write what is left, end the threads, unregister, and close connections."""
        assert self._loop is not None
        self._maintenance.stop_scheduling()
        self._stopped.set()
        await self._listeners.stop()
        await asyncio.to_thread(self._completer.wait_idle, WRITES_WAIT)
        await asyncio.wrap_future(self._receivers.post(lambda: None))
        await asyncio.to_thread(self._maintenance.join)
        await self._db.call(self.lease.unregister)
        for executor in {self._db.executor, self._writer}:
            await self._loop.run_in_executor(executor, connections.close_all)
            executor.shutdown(wait=True)
        # Threads of requeued sync tasks cannot be stopped; do not wait for them.
        await asyncio.to_thread(self._threads.stop, not self.abandoned)
        self._receivers.stop(timeout=5)
        logger.info(
            "Worker stopped worker_id=%s processed=%d",
            self.worker_id,
            self.processed,
            extra={"action": "worker_stop", "worker_id": self.worker_id},
        )

    async def _drain(self) -> None:
        """On a stop, release claimed tasks that have not started; wait for running ones up to
        the shutdown timeout, then requeue what is left. (After --max-tasks, the claimed tasks
        all run: they are the ones it counted.)"""
        producer, executor = self._producer, self._executor
        assert executor is not None
        if producer.stopping:
            await producer.release_unstarted()
            events.emit("stopping", worker_id=self.worker_id, running=self.running)
        if not self.running:
            return
        logger.info("Waiting for %d running task(s) worker_id=%s", self.running, self.worker_id)
        loop = asyncio.get_running_loop()
        deadline = None if self.shutdown_timeout is None else loop.time() + self.shutdown_timeout
        while self.running and (deadline is None or loop.time() < deadline):
            await producer.sleep(0.1 if deadline is None else min(0.1, deadline - loop.time()))
        if not self.running:
            return
        logger.warning(
            "Shutdown timeout: requeueing %d running task(s) worker_id=%s",
            self.running,
            self.worker_id,
        )
        executor.abandon()  # async tasks stop here; sync threads run on, their result unused
        await asyncio.to_thread(self._completer.wait_idle, WRITES_WAIT)
        await self._db.call(
            self._claims.requeue_owned, "The worker stopped before this task finished."
        )

    def _begin_stop(self) -> None:
        if self._producer.stopping:
            return
        self._producer.stop()
        self._maintenance.stop_scheduling()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        assert self._loop is not None
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._loop.add_signal_handler(signum, self._on_signal, signum)

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self._producer.stopping:
            logger.warning("Received %s again: stopping now", name)
            self.force_stop()
        logger.warning(
            "Received %s: finishing %d running task(s), then exiting (send it again to stop now)",
            name,
            self.running,
        )
        self._begin_stop()


def shares_database_thread(database: str) -> bool:
    """Whether a worker on ``database`` writes its outcomes and runs its periodic tasks on its
    database thread: where the main claim runs on the event loop (PostgreSQL through psycopg
    3), which leaves that thread the heartbeat and the upkeep, or where the database takes one
    writer at a time (SQLite)."""
    return dialect_for(connections[database]).single_writer or LoopDatabase.available(database)


def _connect(database: str) -> None:
    with contextlib.suppress(DatabaseError):  # the first write connects again, and retries
        connections[database].ensure_connection()
