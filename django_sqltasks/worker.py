"""The worker: claims batches of due tasks and runs them, async ones on an event loop, sync
ones on a thread pool, and records their outcomes in batches."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar

from django.db import close_old_connections, connections
from django.utils import timezone
from django.utils.crypto import get_random_string

from . import execution
from .backend import SQLTaskBackend
from .compat import task_backends, task_finished, task_started
from .database import run_with_retries
from .exceptions import TaskNotFound
from .sql import ClaimedRow, Outcome, dialect_for

logger = logging.getLogger("django_sqltasks")

T = TypeVar("T")

MAX_WORKER_ID_LENGTH = 64
MAX_COMPLETION_BATCH = 500  # outcomes written by one statement
GATHER_DELAY = 0.002  # seconds to let more slots free up before claiming a small batch


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
    ) -> None:
        task_backend = task_backends[backend]
        if not isinstance(task_backend, SQLTaskBackend):
            raise ValueError(
                f"Backend {backend!r} is a {type(task_backend).__qualname__}, not a "
                "django_sqltasks SQLTaskBackend: this worker only runs its tasks."
            )
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}.")
        if max_tasks is not None and max_tasks < 1:
            raise ValueError(f"max_tasks must be at least 1, not {max_tasks}.")
        if worker_id is not None and not 0 < len(worker_id) <= MAX_WORKER_ID_LENGTH:
            raise ValueError(f"worker_id must be 1 to {MAX_WORKER_ID_LENGTH} characters long.")
        self.backend = task_backend
        self.backend_class = type(task_backend)
        self.database = task_backend.database
        self.queue_names = None if queue_names is None or "*" in queue_names else queue_names
        self.concurrency = concurrency
        self.burst = burst
        self.max_tasks = max_tasks
        self.worker_id = worker_id or f"{socket.gethostname()[:40]}-{get_random_string(12)}"
        self.poll_interval = poll_interval or task_backend.config.poll_interval
        self.shutdown_timeout = shutdown_timeout
        self.lease_timeout = task_backend.config.lease_timeout
        self.heartbeat_interval = task_backend.config.heartbeat_interval

        self.claimed = 0  # tasks claimed since start
        self.processed = 0  # tasks whose outcome was written
        self._running: dict[uuid.UUID, asyncio.Task[None]] = {}
        self._pending: list[tuple[Outcome, asyncio.Future[bool]]] = []
        self._stopping = False
        self.abandoned = False  # True when the shutdown timeout left tasks running
        self._stopped = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._outcomes_ready: asyncio.Event | None = None
        self._db = ThreadPoolExecutor(1, thread_name_prefix="sqltasks-db")
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="sqltasks-task")

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
        """Put this worker's running tasks back in the queue and exit the process now."""
        logger.warning("Forced stop worker_id=%s: requeueing running tasks", self.worker_id)

        def requeue() -> None:
            try:
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

    # Main loop ---------------------------------------------------------------------------

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._outcomes_ready = asyncio.Event()
        self._install_signal_handlers()
        await self._db_call(self._register)
        heartbeat = threading.Thread(target=self._heartbeat_loop, name="sqltasks-heartbeat")
        heartbeat.daemon = True
        heartbeat.start()
        flusher = self._loop.create_task(self._flush_loop())
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
            await self._wait_outcomes_written()
            flusher.cancel()
            heartbeat.join(timeout=self.heartbeat_interval + 5)
            await self._db_call(self._unregister)
            await self._loop.run_in_executor(self._db, connections.close_all)
            self._db.shutdown(wait=True)
            if self.abandoned:
                # Threads of requeued sync tasks cannot be stopped; do not wait for them.
                self._pool.shutdown(wait=False, cancel_futures=True)
            else:
                self._close_pool_connections()
                self._pool.shutdown(wait=True)
            logger.info(
                "Worker stopped worker_id=%s processed=%d",
                self.worker_id,
                self.processed,
                extra={"action": "worker_stop", "worker_id": self.worker_id},
            )

    async def _claim_loop(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            free = self.concurrency - len(self._running)
            if self.max_tasks is not None:
                free = min(free, self.max_tasks - self.claimed)
                if free <= 0 and self.claimed >= self.max_tasks:
                    return
            if free <= 0 or (0 < free < self.concurrency // 4 and self._running):
                # Wait for more free slots, so claims come in batches rather than one by one.
                await self._sleep(GATHER_DELAY if free > 0 else self.poll_interval)
                continue
            try:
                rows = await self._db_call(self._claim, free)
            except Exception:
                logger.exception("Claim failed worker_id=%s; retrying", self.worker_id)
                await self._db_call_quietly(self._reconcile)
                await self._sleep(self.poll_interval)
                continue
            self.claimed += len(rows)
            for row in rows:
                self._start(row)
            if len(rows) < free:
                if self.burst and not rows and not self._running:
                    return
                await self._sleep(self.poll_interval)

    async def _sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, waking early when a task finishes or a stop is asked."""
        assert self._wake is not None
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    async def _drain(self) -> None:
        """Wait for running tasks, up to the shutdown timeout, then requeue what is left."""
        if not self._running:
            return
        logger.info(
            "Waiting for %d running task(s) worker_id=%s", len(self._running), self.worker_id
        )
        _, still_running = await asyncio.wait(
            list(self._running.values()), timeout=self.shutdown_timeout
        )
        if still_running:
            logger.warning(
                "Shutdown timeout: requeueing %d running task(s) worker_id=%s",
                len(still_running),
                self.worker_id,
            )
            self.abandoned = True
            await self._wait_outcomes_written()
            await self._db_call(
                self._requeue_owned, "The worker stopped before this task finished."
            )
            for job in still_running:
                job.cancel()  # async tasks stop here; sync threads run on, their result unused

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
            len(self._running),
        )
        self._begin_stop()

    # Running tasks -----------------------------------------------------------------------

    def _start(self, row: ClaimedRow) -> None:
        assert self._loop is not None
        job = self._loop.create_task(self._execute(row))
        self._running[row.id] = job
        job.add_done_callback(lambda _: self._finished(row.id))

    def _finished(self, task_id: uuid.UUID) -> None:
        self._running.pop(task_id, None)
        if self._wake is not None:
            self._wake.set()

    async def _execute(self, row: ClaimedRow) -> None:
        assert self._loop is not None
        try:
            attempt = execution.prepare(row)
        except TaskNotFound as e:
            logger.error("Task id=%s cannot run: %s", row.id, e)
            await self._record(execution.failure(row.id, e))
            return
        except Exception as e:
            logger.exception("Task id=%s path=%s could not be prepared", row.id, row.task_path)
            await self._record(execution.failure(row.id, e))
            return
        if attempt.is_async:
            await self._run_async(attempt)
        else:
            await self._loop.run_in_executor(self._pool, self._run_sync, attempt)

    def _run_sync(self, attempt: execution.Attempt) -> None:
        """Run a sync task on this pool thread, from task_started to task_finished."""
        assert self._loop is not None
        result = attempt.result
        self._send(task_started, attempt)
        try:
            args, kwargs = attempt.call_args()
            outcome, value = execution.success(attempt.row.id, attempt.task.func(*args, **kwargs))
        except BaseException as e:  # a task's SystemExit or KeyboardInterrupt fails the task only
            outcome = execution.failure(attempt.row.id, e)
            written = self._record_threadsafe(outcome)
            execution.apply(result, outcome)
            self._log_failure(attempt, written)
            self._send(task_finished, attempt)  # inside except: receivers see sys.exc_info()
        else:
            written = self._record_threadsafe(outcome)
            execution.apply(result, outcome, value)
            self._log_success(attempt, written)
            self._send(task_finished, attempt)
        finally:
            close_old_connections()

    async def _run_async(self, attempt: execution.Attempt) -> None:
        """Run an async task on the event loop; signals go to the pool, where ORM calls work."""
        assert self._loop is not None
        result = attempt.result
        await self._loop.run_in_executor(self._pool, self._send_in_pool, task_started, attempt)
        try:
            args, kwargs = attempt.call_args()
            outcome, value = execution.success(
                attempt.row.id, await attempt.task.func(*args, **kwargs)
            )
        except asyncio.CancelledError:
            if self.abandoned:
                raise  # cancelled by the shutdown timeout, and requeued already
            outcome = execution.failure(attempt.row.id, asyncio.CancelledError())
            written = await self._record(outcome)
            execution.apply(result, outcome)
            self._log_failure(attempt, written, None)
            await self._loop.run_in_executor(self._pool, self._send_in_pool, task_finished, attempt)
        except BaseException as e:
            outcome = execution.failure(attempt.row.id, e)
            written = await self._record(outcome)
            execution.apply(result, outcome)
            self._log_failure(attempt, written, e)
            await self._loop.run_in_executor(self._pool, self._send_failed, attempt, e)
        else:
            written = await self._record(outcome)
            execution.apply(result, outcome, value)
            self._log_success(attempt, written)
            await self._loop.run_in_executor(self._pool, self._send_in_pool, task_finished, attempt)

    def _close_pool_connections(self) -> None:
        """Close the connections tasks opened on each pool thread, from that thread."""
        threads = len(self._pool._threads)
        if not threads:
            return
        barrier = threading.Barrier(threads)

        def close() -> None:
            connections.close_all()
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=5)  # hold this thread so each thread gets one call

        for future in [self._pool.submit(close) for _ in range(threads)]:
            future.result()

    def _send_in_pool(self, signal_: Any, attempt: execution.Attempt) -> None:
        try:
            self._send(signal_, attempt)
        finally:
            close_old_connections()

    def _send(self, signal_: Any, attempt: execution.Attempt) -> None:
        for receiver, response in signal_.send_robust(
            self.backend_class, task_result=attempt.result
        ):
            if isinstance(response, Exception):
                logger.error(
                    "Signal receiver %r failed for task id=%s",
                    receiver,
                    attempt.result.id,
                    exc_info=response,
                )

    def _send_failed(self, attempt: execution.Attempt, exc: BaseException) -> None:
        try:
            raise exc
        except BaseException:
            self._send_in_pool(task_finished, attempt)  # receivers see the task's exception

    def _log_success(self, attempt: execution.Attempt, written: bool) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "Task id=%s path=%s state=SUCCESSFUL attempt=%d",
                attempt.result.id,
                attempt.task.module_path,
                attempt.row.attempts,
                extra={"action": "task_successful", "task_id": attempt.result.id},
            )

    def _log_failure(
        self, attempt: execution.Attempt, written: bool, exc: BaseException | None = None
    ) -> None:
        logger.error(
            "Task id=%s path=%s state=FAILED attempt=%d",
            attempt.result.id,
            attempt.task.module_path,
            attempt.row.attempts,
            exc_info=exc if exc is not None else True,
            extra={"action": "task_failed", "task_id": attempt.result.id},
        )

    # Recording outcomes ------------------------------------------------------------------

    async def _record(self, outcome: Outcome) -> bool:
        """Queue ``outcome`` for the next batched write; return whether the row was ours."""
        assert self._loop is not None and self._outcomes_ready is not None
        future: asyncio.Future[bool] = self._loop.create_future()
        self._pending.append((outcome, future))
        self._outcomes_ready.set()
        return await future

    def _record_threadsafe(self, outcome: Outcome) -> bool:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(self._record(outcome), self._loop).result()

    async def _flush_loop(self) -> None:
        """Write pending outcomes; while one write runs, the next batch gathers."""
        assert self._outcomes_ready is not None
        while True:
            await self._outcomes_ready.wait()
            batch = self._pending[:MAX_COMPLETION_BATCH]
            del self._pending[:MAX_COMPLETION_BATCH]
            if not self._pending:
                self._outcomes_ready.clear()
            if not batch:
                continue
            outcomes = [outcome for outcome, _ in batch]
            while True:
                try:
                    written = await self._db_call(self._complete, outcomes)
                    break
                except Exception:
                    logger.exception("Writing %d outcome(s) failed; retrying", len(outcomes))
                    await asyncio.sleep(1.0)
            self.processed += len(batch)
            for outcome, future in batch:
                if not future.done():
                    future.set_result(outcome.id in written)
                if outcome.id not in written:
                    logger.warning(
                        "Task id=%s was no longer held by worker_id=%s (rescued by another "
                        "worker?); its outcome was not recorded",
                        outcome.id,
                        self.worker_id,
                    )

    async def _wait_outcomes_written(self) -> None:
        futures = [future for _, future in self._pending]
        if futures:
            await asyncio.wait(futures, timeout=30)

    # Database calls (all on the one database thread) -------------------------------------

    async def _db_call(self, fn: Callable[..., T], *args: Any) -> T:
        assert self._loop is not None
        return await self._loop.run_in_executor(
            self._db, run_with_retries, self.database, lambda: fn(*args), self._stopped
        )

    async def _db_call_quietly(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            await self._db_call(fn, *args)
        except Exception:
            logger.exception("Database call %s failed", getattr(fn, "__name__", fn))

    def _cursor_call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        connection = connections[self.database]
        with connection.cursor() as cursor:
            return fn(dialect_for(connection), cursor, *args, **kwargs)

    def _claim(self, limit: int) -> list[ClaimedRow]:
        return self._cursor_call(
            lambda d, c: d.claim(
                c,
                backend_name=self.backend.alias,
                queue_names=self.queue_names,
                worker_id=self.worker_id,
                now=timezone.now(),
                limit=limit,
            )
        )

    def _complete(self, outcomes: list[Outcome]) -> set[uuid.UUID]:
        return self._cursor_call(lambda d, c: d.complete(c, self.worker_id, outcomes))

    def _reconcile(self) -> None:
        """After a failed claim, requeue rows the claim may have taken without our knowing."""
        keep = list(self._running)
        count = self._cursor_call(
            lambda d, c: d.requeue_owned(
                c,
                worker_id=self.worker_id,
                now=timezone.now(),
                reason="The claim that took this task failed before the worker saw it.",
                keep=keep,
            )
        )
        if count:
            logger.warning("Requeued %d task(s) from a failed claim", count)

    def _requeue_owned(self, reason: str) -> int:
        return self._cursor_call(
            lambda d, c: d.requeue_owned(
                c, worker_id=self.worker_id, now=timezone.now(), reason=reason
            )
        )

    def _register(self) -> None:
        from .models import WorkerRecord

        now = timezone.now()
        records = WorkerRecord.objects.using(self.database)
        existing = records.filter(id=self.worker_id).first()
        if existing is not None:
            if existing.heartbeat_at >= now - timedelta(seconds=self.lease_timeout):
                raise RuntimeError(
                    f"Worker id {self.worker_id!r} is in use by a live worker "
                    f"(pid {existing.pid} on {existing.hostname!r}); choose another --worker-id."
                )
            self._rescue(now)
            existing.delete()
        records.create(
            id=self.worker_id,
            backend_name=self.backend.alias,
            queue_names=self.queue_names or ["*"],
            hostname=socket.gethostname()[:255],
            pid=os.getpid(),
            concurrency=self.concurrency,
            started_at=now,
            heartbeat_at=now,
        )
        self._rescue(now)

    def _unregister(self) -> None:
        from .models import WorkerRecord

        WorkerRecord.objects.using(self.database).filter(id=self.worker_id).delete()

    def _heartbeat(self) -> None:
        from .models import WorkerRecord

        now = timezone.now()
        records = WorkerRecord.objects.using(self.database)
        if not records.filter(id=self.worker_id).update(heartbeat_at=now):
            logger.warning(
                "Worker row of worker_id=%s was gone (declared dead after a stall?); "
                "re-registering",
                self.worker_id,
            )
            records.create(
                id=self.worker_id,
                backend_name=self.backend.alias,
                queue_names=self.queue_names or ["*"],
                hostname=socket.gethostname()[:255],
                pid=os.getpid(),
                concurrency=self.concurrency,
                started_at=now,
                heartbeat_at=now,
            )
        self._rescue(now)

    def _rescue(self, now: Any) -> None:
        """Requeue tasks of workers whose lease expired, then forget those workers."""
        from .models import WorkerRecord

        cutoff = now - timedelta(seconds=self.lease_timeout)
        count = self._cursor_call(
            lambda d, c: d.requeue_orphans(
                c, backend_name=self.backend.alias, live_since=cutoff, now=now
            )
        )
        if count:
            logger.warning(
                "Rescued %d task(s) of workers silent for over %ss",
                count,
                self.lease_timeout,
                extra={"action": "rescue", "count": count},
            )
        WorkerRecord.objects.using(self.database).filter(heartbeat_at__lt=cutoff).delete()

    def _heartbeat_loop(self) -> None:
        """Beat on a thread of its own, so a busy event loop cannot starve the lease."""
        while not self._stopped.wait(self.heartbeat_interval):
            future: Future[Any] = self._db.submit(
                run_with_retries, self.database, self._heartbeat, self._stopped
            )
            try:
                future.result()
            except Exception:
                logger.exception("Heartbeat failed worker_id=%s", self.worker_id)
