"""The worker: claims batches of due tasks and runs them, async ones on an event loop, sync
ones on task threads, and records their outcomes in batches."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from functools import lru_cache, partial
from typing import Any, TypeVar

from django.db import DatabaseError, connections
from django.db.backends.utils import CursorWrapper
from django.utils import timezone
from django.utils.crypto import get_random_string

from . import execution
from .backend import SQLTaskBackend
from .compat import task_backends, task_finished, task_started
from .completer import Batch, Completer
from .database import is_transient, run_with_retries
from .exceptions import TaskCancelled, TaskTimeout
from .lease import Lease
from .results import resolve_task
from .signals import Receivers
from .sql import ClaimedRow, Dialect, Outcome, dialect_for
from .threads import SignalThread, TaskThreads
from .wakeup import Wakeup, wakeup_for

logger = logging.getLogger("django_sqltasks")

T = TypeVar("T")

MAX_WORKER_ID_LENGTH = 64
GATHER_DELAY = 0.002  # seconds to let more slots free up before claiming a small batch
BUSY_POLL = 0.01  # seconds before polling again right after finding work; doubles when idle


@lru_cache(maxsize=1024)
def _task_is_async(task_path: str) -> bool:
    return execution.is_async(resolve_task(task_path))  # an error is raised, not cached


def _is_async(task_path: str) -> bool:
    """Whether the task at ``task_path`` runs on the event loop; an unknown path runs on a task
    thread, which records why it cannot run."""
    try:
        return _task_is_async(task_path)
    except Exception:
        return False


def _start_order(row: ClaimedRow) -> tuple[int, Any]:
    return -row.priority, row.run_after or row.enqueued_at


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
    ) -> None:
        task_backend = task_backends[backend]
        if not isinstance(task_backend, SQLTaskBackend):
            raise ValueError(
                f"Backend {backend!r} is a {type(task_backend).__qualname__}, not a "
                "django_sqltasks SQLTaskBackend: this worker only runs its tasks."
            )
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}.")
        if prefetch is not None and prefetch < 0:
            raise ValueError(f"prefetch must be 0 or more, not {prefetch}.")
        if max_tasks is not None and max_tasks < 1:
            raise ValueError(f"max_tasks must be at least 1, not {max_tasks}.")
        if worker_id is not None and not 0 < len(worker_id) <= MAX_WORKER_ID_LENGTH:
            raise ValueError(f"worker_id must be 1 to {MAX_WORKER_ID_LENGTH} characters long.")
        self.backend = task_backend
        self.backend_class = type(task_backend)
        self.database = task_backend.database
        self.queue_names = None if queue_names is None or "*" in queue_names else queue_names
        self.concurrency = concurrency
        # Tasks claimed beyond the free slots, started as slots free up: a finished task's slot
        # is filled at once instead of after the next claim's round trip.
        self.prefetch = concurrency // 4 if prefetch is None else prefetch
        self.burst = burst
        self.max_tasks = max_tasks
        self.worker_id = worker_id or f"{socket.gethostname()[:40]}-{get_random_string(12)}"
        self.poll_interval = poll_interval or task_backend.config.poll_interval
        self.shutdown_timeout = shutdown_timeout
        self.heartbeat_interval = task_backend.config.heartbeat_interval
        self._max_result_bytes = task_backend.config.max_payload_bytes
        self.lease = Lease(
            worker_id=self.worker_id,
            backend_name=task_backend.alias,
            database=self.database,
            queue_names=self.queue_names,
            concurrency=concurrency,
            timeout=task_backend.config.lease_timeout,
            max_rescues=task_backend.config.max_rescues,
        )
        from .pruning import Retention  # imports the models: not at module import

        self.retention = Retention.for_backend(task_backend)  # PRUNE_*_DAYS, or None

        self.claimed = 0  # tasks claimed since start
        self.processed = 0  # task outcomes written
        self.abandoned = False  # True when the shutdown timeout left tasks running
        self._finished = 0  # claimed tasks whose function has returned (any thread)
        self._in_flight: set[uuid.UUID] = set()  # claimed, function not returned yet
        self._waiting: deque[ClaimedRow] = deque()  # claimed, waiting for a free slot
        self._active = 0  # tasks started (handed to a thread or the loop), not returned yet
        self._started: Receivers | None = None  # task_started receivers, as of the last claim
        self._async_starting: list[ClaimedRow] = []  # async rows to start this turn of the loop
        self._count_lock = threading.Lock()
        self._wake_below = 0  # the claim loop wants waking once this few tasks run
        self._async_jobs: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._stopped = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0  # the ident of the thread running the loop
        self._wake: asyncio.Event | None = None
        self._db = ThreadPoolExecutor(1, thread_name_prefix="sqltasks-db")
        # Outcomes are written on a connection of their own, so that a claim and a write run
        # at the same time; SQLite takes one writer at a time, so there they share one.
        self._writer = (
            self._db
            if connections[self.database].vendor == "sqlite"
            else ThreadPoolExecutor(1, thread_name_prefix="sqltasks-writer")
        )
        self._threads = TaskThreads(concurrency)
        self._signals: SignalThread | None = None
        self._wakeup: Wakeup | None = None
        self._wake_pending = False
        self._idle_sleep = self.poll_interval
        self._claim_uncertain = False  # a claim failed without telling us what it took
        self._async_by_id: dict[uuid.UUID, asyncio.Task[None]] = {}
        self._cancel_requested: set[uuid.UUID] = set()
        self._completer = Completer(self._write_outcomes, self._writer, self._on_written)

    # Public controls --------------------------------------------------------------------

    def run(self) -> None:
        """Run until stopped; install SIGINT/SIGTERM handlers when on the main thread."""
        asyncio.run(self._main())

    def stop(self) -> None:
        """Stop claiming and let running tasks finish; safe to call from any thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._begin_stop)
        else:
            self._stopping = True

    def force_stop(self) -> None:
        """Write what is finished, put running tasks back in the queue, and exit now."""
        logger.warning("Forced stop worker_id=%s: requeueing running tasks", self.worker_id)

        def requeue() -> None:
            try:
                self._completer.wait_idle(timeout=2)
                self._requeue_owned("The worker was forced to stop while this task ran.")
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
        self._db.submit(self._check_database).result()

    def _check_database(self) -> None:
        from .checks import unsupported_version
        from .models import TaskRecord

        message = unsupported_version(self.database)
        if message:
            raise RuntimeError(message)
        try:
            TaskRecord.objects.using(self.database).exists()
        except DatabaseError as e:
            raise RuntimeError(
                f"Cannot read the task table on database {self.database!r} ({e}); run "
                "'manage.py migrate django_sqltasks' first."
            ) from e

    @property
    def running(self) -> int:
        """Claimed tasks whose function has not returned yet."""
        return self.claimed - self._finished

    # Main loop ---------------------------------------------------------------------------

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake = asyncio.Event()
        self._signals = SignalThread()
        self._install_signal_handlers()
        if self._writer is not self._db:
            # Connect the outcome writer while the worker registers: the first outcome is
            # written sooner.
            self._writer.submit(self._connect_writer)
        await self._db_call(self.lease.register)
        self._wakeup = wakeup_for(
            self.database,
            connections[self.database].vendor,
            self.backend.config.notify,
            self._on_wake,
        )
        self._wakeup.start()
        heartbeat = threading.Thread(
            target=self._heartbeat_loop, name="sqltasks-heartbeat", daemon=True
        )
        heartbeat.start()
        scheduler = threading.Thread(
            target=self._schedule_loop, name="sqltasks-periodic", daemon=True
        )
        scheduler.start()
        logger.info(
            "Worker started worker_id=%s backend=%s database=%s queues=%s concurrency=%d",
            self.worker_id,
            self.backend.alias,
            self.database,
            ",".join(self.queue_names) if self.queue_names else "*",
            self.concurrency,
            extra={"action": "worker_start", "worker_id": self.worker_id},
        )
        try:
            await self._claim_loop()
            await self._drain()
        finally:
            self._stopped.set()
            if self._wakeup is not None:
                self._wakeup.stop()
            await asyncio.to_thread(self._completer.wait_idle, 30)
            await asyncio.wrap_future(self._signals.post(lambda: None))
            heartbeat.join(timeout=self.heartbeat_interval + 5)
            scheduler.join(timeout=5)
            await self._db_call(self.lease.unregister)
            for executor in {self._db, self._writer}:
                await self._loop.run_in_executor(executor, connections.close_all)
                executor.shutdown(wait=True)
            # Threads of requeued sync tasks cannot be stopped; do not wait for them.
            await asyncio.to_thread(self._threads.stop, not self.abandoned)
            self._signals.stop(timeout=5)
            logger.info(
                "Worker stopped worker_id=%s processed=%d",
                self.worker_id,
                self.processed,
                extra={"action": "worker_stop", "worker_id": self.worker_id},
            )

    @property
    def _capacity(self) -> int:
        """The most tasks held at once: the slots, and the prefetched tasks waiting for one."""
        return self.concurrency + self.prefetch

    async def _claim_loop(self) -> None:
        while not self._stopping:
            running = self.running
            free = self._capacity - running
            if self.max_tasks is not None:
                free = min(free, self.max_tasks - self.claimed)
                if free <= 0 and self.claimed >= self.max_tasks:
                    return
            if free <= 0 or (running and free < self._capacity // 4):
                # Wait for more free slots, so claims come in batches rather than one by one.
                await self._sleep(GATHER_DELAY if free > 0 else self.poll_interval)
                continue
            written_before = self.processed
            try:
                rows = await self._db_call(self._claim, free)
            except Exception:
                logger.exception("Claim failed worker_id=%s; retrying", self.worker_id)
                await self._sleep(self.poll_interval)
                continue
            self.claimed += len(rows)
            self._hold(rows)
            if len(rows) < free:
                if self.burst and not rows and not self.running:
                    # Done only if no outcome was written since this claim began: a retry
                    # written meanwhile is READY again and must be claimed.
                    if self._completer.wait_idle(0) and self.processed == written_before:
                        return
                    await asyncio.to_thread(self._completer.wait_idle, 30)
                    continue
                # Poll soon after finding work, then back off to the poll interval.
                idle, self._idle_sleep = (
                    (BUSY_POLL, BUSY_POLL * 2)
                    if rows
                    else (self._idle_sleep, min(self.poll_interval, self._idle_sleep * 2))
                )
                await self._sleep(min(idle, self.poll_interval))

    async def _sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``; wake early once a quarter of the slots are free, all tasks
        are done, or a stop is asked."""
        assert self._wake is not None
        if self._threads.balance():
            seconds = min(seconds, self._threads.spawn_after)
        with self._count_lock:
            self._wake_below = self._capacity - max(1, self._capacity // 4)
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    def _on_wake(self, queue_name: str | None) -> None:
        """A task may have been enqueued (from the wake-up thread): claim without waiting."""
        queues = self.queue_names
        if queue_name is not None and queues is not None and queue_name not in queues:
            return
        if self._wake_pending or self._loop is None or self._wake is None:
            return
        self._wake_pending = True
        with contextlib.suppress(RuntimeError):  # the loop is closing
            self._loop.call_soon_threadsafe(self._woken)

    def _woken(self) -> None:
        self._wake_pending = False
        self._idle_sleep = BUSY_POLL
        assert self._wake is not None
        self._wake.set()

    def _task_done(self, task_id: uuid.UUID) -> None:
        """Count a finished task function (from any thread), start a waiting task in its slot,
        and wake a waiting claim loop."""
        with self._count_lock:
            self._finished += 1
            self._active -= 1
            self._in_flight.discard(task_id)
            ready = self._take_waiting() if self._waiting else None
            wake = self.claimed - self._finished <= self._wake_below
            if wake:
                self._wake_below = -1  # once is enough until the loop sleeps again
        if ready:
            self._start(ready)
        if wake and self._loop is not None and self._wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed during a forced stop
                self._loop.call_soon_threadsafe(self._wake.set)

    async def _drain(self) -> None:
        """On a stop, release claimed tasks that have not started; wait for running ones up to
        the shutdown timeout, then requeue what is left. (After --max-tasks, the claimed tasks
        all run: they are the ones it counted.)"""
        if self._stopping:
            await self._release_unstarted()
        if not self.running:
            return
        logger.info("Waiting for %d running task(s) worker_id=%s", self.running, self.worker_id)
        loop = asyncio.get_running_loop()
        deadline = None if self.shutdown_timeout is None else loop.time() + self.shutdown_timeout
        while self.running and (deadline is None or loop.time() < deadline):
            await self._sleep(0.1 if deadline is None else min(0.1, deadline - loop.time()))
        if not self.running:
            return
        logger.warning(
            "Shutdown timeout: requeueing %d running task(s) worker_id=%s",
            self.running,
            self.worker_id,
        )
        self.abandoned = True
        await asyncio.to_thread(self._completer.wait_idle, 30)
        await self._db_call(self._requeue_owned, "The worker stopped before this task finished.")
        for job in list(self._async_jobs):
            job.cancel()  # async tasks stop here; sync threads run on, their result unused

    async def _release_unstarted(self) -> None:
        """Put claimed tasks that have not started (prefetched ones, and sync ones that no
        thread has taken yet) back to READY: another worker can start them now, instead of
        after this worker's running tasks."""
        waiting = self._drop_waiting()  # no longer in flight: requeued below
        queued = [row for row, _ in self._threads.take_queued()]
        for row in queued:
            self._task_done(row.id)  # no longer in flight: requeued below
        if not waiting and not queued:
            return
        count = await self._db_call(
            partial(
                self._requeue_owned,
                "The worker stopped before this task started.",
                keep_known=True,
            )
        )
        logger.info(
            "Released %d claimed task(s) that had not started worker_id=%s",
            count,
            self.worker_id,
            extra={"action": "tasks_released", "worker_id": self.worker_id},
        )

    def _begin_stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        if self._wake is not None:
            self._wake.set()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        assert self._loop is not None
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._loop.add_signal_handler(signum, self._on_signal, signum)

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self._stopping:
            logger.warning("Received %s again: stopping now", name)
            self.force_stop()
        logger.warning(
            "Received %s: finishing %d running task(s), then exiting (send it again to stop now)",
            name,
            self.running,
        )
        self._begin_stop()

    # Running tasks -----------------------------------------------------------------------

    def _hold(self, rows: list[ClaimedRow]) -> None:
        """Take claimed rows in: start as many as there are free slots, keep the rest waiting."""
        if not rows:
            return
        self._started = Receivers(task_started, self.backend_class)
        # A claim returns its rows in no set order: start them in the order the claim chose
        # them (priority, then due time), as a worker claiming one at a time would.
        rows.sort(key=_start_order)
        with self._count_lock:
            self._in_flight.update(row.id for row in rows)
            self._waiting.extend(rows)
            ready = self._take_waiting()
        self._start(ready)

    def _drop_waiting(self, task_id: uuid.UUID | None = None) -> list[ClaimedRow]:
        """Take the waiting rows (or the one with ``task_id``) out of this worker's hands: they
        will not start here, and no longer count as held. Return them."""
        with self._count_lock:
            if task_id is None:
                dropped = list(self._waiting)
                self._waiting.clear()
            else:
                dropped = [row for row in self._waiting if row.id == task_id]
                for row in dropped:
                    self._waiting.remove(row)
            self._finished += len(dropped)
            self._in_flight.difference_update(row.id for row in dropped)
        return dropped

    def _take_waiting(self) -> list[ClaimedRow]:
        """Pop the waiting rows that free slots can start (with ``_count_lock`` held)."""
        count = min(len(self._waiting), self.concurrency - self._active)
        if count <= 0:
            return []
        self._active += count
        waiting = self._waiting
        return [waiting.popleft() for _ in range(count)]

    def _start(self, rows: list[ClaimedRow]) -> None:
        """Start rows that have a slot (from any thread): sync ones on the task threads, async
        ones on the loop."""
        async_rows = []
        sync_rows = []
        for row in rows:
            if _is_async(row.task_path):
                async_rows.append(row)
            else:
                sync_rows.append(row)
        started = self._started
        assert started is not None
        if sync_rows:
            self._threads.submit_many(self._run_sync, [(row, started) for row in sync_rows])
        if async_rows:
            loop = self._loop
            assert loop is not None
            if threading.get_ident() == self._loop_thread:
                self._start_async_soon(async_rows)
            else:
                with contextlib.suppress(RuntimeError):  # the loop closed during a forced stop
                    loop.call_soon_threadsafe(self._start_async_soon, async_rows)

    def _start_async_soon(self, rows: list[ClaimedRow]) -> None:
        """Start async rows at the end of this turn of the loop, with the others started in it
        (tasks finishing together free their slots one by one: one signal hop for them all)."""
        assert self._loop is not None
        if not self._async_starting:
            self._loop.call_soon(self._start_async_batch)
        self._async_starting.extend(rows)

    def _start_async_batch(self) -> None:
        rows, self._async_starting = self._async_starting, []
        assert self._loop is not None
        job = self._loop.create_task(self._start_async(rows))
        self._async_jobs.add(job)
        job.add_done_callback(self._async_jobs.discard)

    def _run_sync(self, item: tuple[ClaimedRow, Receivers]) -> None:
        """Run a sync task on this task thread, up to queueing its outcome."""
        row, started = item
        late = False
        try:
            attempt = self._prepare(row)
            if attempt is None:
                return
            self._send(started, attempt)
            timeout = attempt.policy.timeout
            if timeout is not None:
                assert self._loop is not None
                self._loop.call_soon_threadsafe(
                    self._loop.call_later, timeout, self._sync_timed_out, attempt
                )
            try:
                args, kwargs = attempt.call_args()
                outcome, value = execution.success(
                    row.id, attempt.task.func(*args, **kwargs), self._max_result_bytes
                )
            except BaseException as e:  # a task's SystemExit or KeyboardInterrupt fails it only
                late = timeout is not None and not attempt.settle()
                if not late:
                    self._failed(attempt, e)
            else:
                late = timeout is not None and not attempt.settle()
                if not late:
                    self._succeeded(attempt, outcome, value)
        finally:
            if late:
                logger.warning("Task id=%s ended after its timeout; its result is ignored", row.id)
                self._threads.size -= 1  # its stand-in thread is no longer needed
            else:
                self._task_done(row.id)

    def _sync_timed_out(self, attempt: execution.Attempt) -> None:
        """A sync task ran past its timeout (on the loop): fail it and free its slot.

        Python cannot stop a thread: the task runs on, on a thread the pool no longer counts.
        """
        if not attempt.settle():
            return
        timeout = attempt.policy.timeout
        logger.error(
            "Task id=%s path=%s is still running after its %ss timeout; its thread cannot be "
            "stopped and keeps running, its result will be ignored",
            attempt.result.id,
            attempt.task.module_path,
            timeout,
            extra={"action": "task_timeout", "task_id": attempt.result.id},
        )
        self._threads.size += 1  # replace the thread the stuck task holds
        self._failed(attempt, TaskTimeout(f"The task ran longer than its timeout of {timeout}s."))
        self._task_done(attempt.row.id)

    async def _start_async(self, rows: list[ClaimedRow]) -> None:
        """Send task_started for a batch of async tasks in one hop, then run them on the loop."""
        attempts = []
        for row in rows:
            attempt = self._prepare(row)
            if attempt is None:
                self._task_done(row.id)
            else:
                attempts.append(attempt)
        assert self._signals is not None and self._started is not None
        await asyncio.wrap_future(self._signals.post(self._send_each, self._started, attempts))
        for attempt in attempts:
            job = asyncio.get_running_loop().create_task(self._run_async(attempt))
            self._async_jobs.add(job)
            job.add_done_callback(self._async_jobs.discard)
            self._async_by_id[attempt.row.id] = job
            job.add_done_callback(partial(self._forget_async, attempt.row.id))

    async def _run_async(self, attempt: execution.Attempt) -> None:
        try:
            args, kwargs = attempt.call_args()
            value = await self._call_async(attempt, args, kwargs)
            outcome, value = execution.success(attempt.row.id, value, self._max_result_bytes)
        except asyncio.CancelledError as e:
            if attempt.row.id in self._cancel_requested:
                cancelled = TaskCancelled("Cancelled while running, at the request of a user.")
                cancelled.__cause__ = e
                self._failed(attempt, cancelled)
            elif self.abandoned:
                raise  # cancelled by the shutdown timeout, and requeued already
            else:
                self._failed(attempt, e)
        except BaseException as e:
            self._failed(attempt, e)
        else:
            self._succeeded(attempt, outcome, value)
        finally:
            self._task_done(attempt.row.id)

    async def _call_async(
        self, attempt: execution.Attempt, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        timeout = attempt.policy.timeout
        if timeout is None:
            return await attempt.task.func(*args, **kwargs)
        job = asyncio.ensure_future(attempt.task.func(*args, **kwargs))
        try:
            done, _ = await asyncio.wait({job}, timeout=timeout)
        except asyncio.CancelledError:
            job.cancel()
            raise
        if not done:
            job.cancel()
            with contextlib.suppress(BaseException):
                await job
            raise TaskTimeout(f"The task ran longer than its timeout of {timeout}s.")
        return job.result()

    def _prepare(self, row: ClaimedRow) -> execution.Attempt | None:
        try:
            return execution.prepare(row, self.backend.config)
        except Exception as e:
            logger.error("Task id=%s path=%s cannot run: %s", row.id, row.task_path, e)
            self._completer.submit(execution.failure(row.id, e), None)
            return None

    def _succeeded(self, attempt: execution.Attempt, outcome: Outcome, value: Any) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "Task id=%s path=%s state=SUCCESSFUL attempt=%d",
                attempt.result.id,
                attempt.task.module_path,
                attempt.row.attempts,
                extra={"action": "task_successful", "task_id": attempt.result.id},
            )
        self._completer.submit(outcome, (attempt, None, value))

    def _failed(self, attempt: execution.Attempt, exc: BaseException) -> None:
        number, policy = attempt.row.attempts, attempt.policy
        if policy.should_retry(number, exc):
            delay = policy.delay(number)
            logger.warning(
                "Task id=%s path=%s failed on attempt %d of %d; retrying in %.1fs",
                attempt.result.id,
                attempt.task.module_path,
                number,
                policy.max_attempts,
                delay,
                exc_info=exc,
                extra={"action": "task_retry", "task_id": attempt.result.id},
            )
            outcome = execution.retry(
                attempt.row.id, exc, timezone.now() + timedelta(seconds=delay)
            )
        else:
            logger.error(
                "Task id=%s path=%s state=FAILED attempt=%d",
                attempt.result.id,
                attempt.task.module_path,
                number,
                exc_info=exc,
                extra={"action": "task_failed", "task_id": attempt.result.id},
            )
            outcome = execution.failure(attempt.row.id, exc)
        self._completer.submit(outcome, (attempt, exc, None))

    # Signals (on the signal thread, after the outcome is stored) ----------------------------

    def _on_written(self, batch: Batch) -> None:
        self.processed += len(batch.outcomes)
        assert self._signals is not None
        self._signals.post(self._send_finished, batch)

    def _send_finished(self, batch: Batch) -> None:
        finished = Receivers(task_finished, self.backend_class)
        for outcome, context in zip(batch.outcomes, batch.contexts, strict=True):
            if context is None or outcome.id not in batch.written:
                continue  # a task that never started, or that another worker holds now
            attempt, exc, value = context
            execution.apply(attempt.result, outcome, value)
            if outcome.status == "READY":
                continue  # retried: not finished yet
            if exc is None:
                self._send(finished, attempt)
                continue
            try:
                raise exc
            except BaseException:
                self._send(finished, attempt)  # receivers see the task's exception

    def _send_each(self, receivers: Receivers, attempts: list[execution.Attempt]) -> None:
        for attempt in attempts:
            self._send(receivers, attempt)

    def _send(self, receivers: Receivers, attempt: execution.Attempt) -> None:
        for receiver, response in receivers.send(task_result=attempt.result):
            if isinstance(response, Exception):
                logger.error(
                    "Signal receiver %r failed for task id=%s",
                    receiver,
                    attempt.result.id,
                    exc_info=response,
                )

    # Database calls (all on the one database thread) -------------------------------------

    async def _db_call(self, fn: Callable[..., T], *args: Any) -> T:
        assert self._loop is not None
        return await self._loop.run_in_executor(
            self._db, run_with_retries, self.database, lambda: fn(*args), self._stopped
        )

    def _cursor_call(self, fn: Callable[[Dialect, CursorWrapper], T]) -> T:
        connection = connections[self.database]
        with connection.cursor() as cursor:
            return fn(dialect_for(connection), cursor)

    def _claim(self, limit: int) -> list[ClaimedRow]:
        if self._claim_uncertain:
            # The last claim failed mid-way: it may have committed rows we never saw, which
            # our heartbeat would keep RUNNING forever. Put them back first.
            self._reconcile()
            self._claim_uncertain = False
        self._claim_uncertain = True
        rows = self._cursor_call(
            lambda d, c: d.claim(
                c,
                backend_name=self.backend.alias,
                queue_names=self.queue_names,
                worker_id=self.worker_id,
                now=timezone.now(),
                limit=limit,
            )
        )
        self._claim_uncertain = False
        return rows

    def _connect_writer(self) -> None:
        with contextlib.suppress(DatabaseError):  # the first write connects again, and retries
            connections[self.database].ensure_connection()

    def _write_outcomes(self, outcomes: list[Outcome]) -> set[Any]:
        try:
            return self._write_retrying(outcomes)
        except DatabaseError as e:
            if is_transient(e):
                raise
            # One bad outcome (too large for the server, say) must not hold up the others.
            logger.error(
                "Writing %d outcome(s) failed (%s); writing them one by one", len(outcomes), e
            )
        written: set[Any] = set()
        for outcome in outcomes:
            try:
                written |= self._write_retrying([outcome])
            except DatabaseError as e:
                if is_transient(e):
                    raise
                reason = f"The database refused this task's outcome: {e}"
                logger.error("Task id=%s: %s", outcome.id, reason)
                written |= run_with_retries(
                    self.database, partial(self._salvage, outcome, reason), self._stopped
                )
        return written

    def _salvage(self, outcome: Outcome, reason: str) -> set[Any]:
        return self._cursor_call(lambda d, c: d.salvage(c, self.worker_id, outcome, reason))

    def _write_retrying(self, outcomes: list[Outcome]) -> set[Any]:
        return run_with_retries(
            self.database,
            lambda: self._cursor_call(lambda d, c: d.complete(c, self.worker_id, outcomes)),
            self._stopped,
        )

    def _reconcile(self) -> None:
        """After a failed claim, requeue rows the claim may have taken without our knowing."""
        count = self._requeue_owned(
            "The claim that took this task failed before the worker saw it.",
            keep_known=True,
        )
        if count:
            logger.warning("Requeued %d task(s) from a failed claim", count)

    def _requeue_owned(self, reason: str, *, keep_known: bool = False) -> int:
        """Put this worker's RUNNING tasks back to READY; with ``keep_known``, only those it
        does not know it holds (running, or with an outcome waiting to be written)."""
        keep: set[uuid.UUID] = set()
        if keep_known:
            with self._count_lock:
                keep = self._in_flight | self._completer.pending_ids()
        return self._cursor_call(
            lambda d, c: d.requeue_owned(
                c, worker_id=self.worker_id, now=timezone.now(), reason=reason, keep=list(keep)
            )
        )

    def _heartbeat_loop(self) -> None:
        """Beat on a thread of its own, so a busy event loop cannot starve the lease."""
        while not self._stopped.wait(self.heartbeat_interval):
            future = self._db.submit(
                run_with_retries, self.database, self.lease.heartbeat, self._stopped
            )
            try:
                future.result()
            except Exception:
                logger.exception("Heartbeat failed worker_id=%s", self.worker_id)
            try:
                requested = self._db.submit(
                    run_with_retries, self.database, self._cancel_requests, self._stopped
                ).result()
            except Exception:
                logger.exception("Reading cancel requests failed worker_id=%s", self.worker_id)
            else:
                self._cancel_running(requested)
            if self.retention is not None and self.retention.due():
                pruning = self._db.submit(
                    run_with_retries, self.database, self.retention.run, self._stopped
                )
                try:
                    pruning.result()
                except Exception:
                    logger.exception("Pruning failed worker_id=%s", self.worker_id)

    def _schedule_loop(self) -> None:
        """Enqueue periodic tasks at their slots (a thread that sleeps until the next slot)."""
        from .periodic import Scheduler

        scheduler = Scheduler(self.backend)
        if not scheduler.schedules:
            return
        while True:
            try:
                self._db.submit(
                    run_with_retries, self.database, scheduler.run_due, self._stopped
                ).result()
            except Exception:
                logger.exception("Periodic tasks failed worker_id=%s", self.worker_id)
            now = timezone.now()
            upcoming = scheduler.next_wakeup(now)
            delay = 1.0 if upcoming is None else (upcoming - now).total_seconds()
            # A little past the slot, so that it is the latest one when computed.
            if self._stopped.wait(max(0.0, delay) + 0.005):
                return

    def _cancel_waiting(self, task_id: uuid.UUID) -> bool:
        """Fail a prefetched task that has not started, as cancelled; False if none waits."""
        if not self._drop_waiting(task_id):
            return False
        logger.warning("Cancelled task id=%s before it started, at a user's request", task_id)
        cancelled = TaskCancelled("Cancelled before it started, at the request of a user.")
        self._completer.submit(execution.failure(task_id, cancelled), None)
        return True

    def _forget_async(self, task_id: uuid.UUID, _job: asyncio.Task[None]) -> None:
        self._async_by_id.pop(task_id, None)

    def _cancel_requests(self) -> list[uuid.UUID]:
        """Ids of our running tasks whose cancellation was asked (on the database thread)."""
        from .models import TaskRecord

        return list(
            TaskRecord.objects.using(self.database)
            .owned_by(self.worker_id)
            .filter(cancel_requested=True)
            .values_list("id", flat=True)
        )

    def _cancel_running(self, task_ids: list[uuid.UUID]) -> None:
        """Cancel the tasks among ``task_ids`` that wait for a slot and the async ones that
        run; running sync ones cannot be stopped."""
        for task_id in task_ids:
            if task_id in self._cancel_requested:
                continue
            self._cancel_requested.add(task_id)
            if self._cancel_waiting(task_id):
                continue
            job = self._async_by_id.get(task_id)
            if job is not None and self._loop is not None:
                logger.warning("Cancelling task id=%s at a user's request", task_id)
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(job.cancel)
            else:
                logger.warning(
                    "Task id=%s was asked to cancel, but it is a sync task: it runs to its end",
                    task_id,
                )
