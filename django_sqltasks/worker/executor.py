"""The executor: runs claimed tasks (sync ones on task threads, async ones on the event loop),
enforces their timeouts and cancellation, and hands each outcome to the completer.

Each claimed task is resolved once, when it is started. The executor reports back through two
narrow calls: ``completer.submit(ended)`` and ``done(task_id)`` ("this task's slot is free").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from ..core.tracing import Tracing
from ..exceptions import Suspended, TaskCancelled
from ..sql import ClaimedRow
from . import attempt as attempts
from . import outcomes
from .atomic import run_atomic
from .attempt import Attempt
from .completer import Completer
from .outcomes import Ended
from .receivers import Receivers
from .reporter import Reporter, aend_report, end_report
from .threads import ReceiverThread, TaskThreads

logger = logging.getLogger("django_sqltasks")

# An attempt to start, and the task_started receivers of the claim that took it.
Starting = tuple[Attempt, Receivers]


class TaskWatch(Protocol):
    """What a supervisor hears of this process's tasks (with --processes: the child's end of
    the pipe, ``processes.pipe.SupervisorLink``). It stops a sync task at its timeout or on a
    cancel, and renews the lease while any task runs. Called from any thread."""

    def sync_started(self, task_id: uuid.UUID, timeout: float | None) -> None: ...

    def sync_ended(self, task_id: uuid.UUID) -> None: ...

    def async_started(self, task_id: uuid.UUID, timeout: float | None) -> None: ...

    def async_ended(self, task_id: uuid.UUID) -> None: ...

    def cancel(self, task_id: uuid.UUID) -> bool:
        """Ask for a running sync task to be stopped; False if none runs here."""
        ...


class Executor:
    """Run tasks; every method says which thread calls it."""

    def __init__(
        self,
        *,
        backend: Any,
        loop: asyncio.AbstractEventLoop,
        threads: TaskThreads,
        receivers: ReceiverThread,
        completer: Completer,
        done: Callable[[uuid.UUID], None],
        suspended: Callable[[uuid.UUID], None],
        supervisor: TaskWatch | None = None,
        reporter: Reporter | None = None,
    ) -> None:
        # Set once here, read from any thread.
        self._config = backend.config
        self._sender = type(backend)
        self._max_result_bytes: int | None = backend.config.max_payload_bytes
        self._loop = loop
        self._loop_thread = threading.get_ident()  # made on the loop thread
        self._threads = threads
        self._receivers = receivers
        self._completer = completer
        self._done = done
        self._suspended = suspended  # before ``done``: the attempt stopped at a sleep or wait
        # With --processes: sync tasks' timeouts and cancels are the supervisor's, which can
        # stop them (by replacing this process); without, a timeout only frees the slot.
        self._supervisor = supervisor
        self._pid = os.getpid()  # a task that forks returns twice: in the child, it exits
        self._reporter = reporter  # writes what tasks report through their context
        self._tracing: Tracing | None = backend.tracing  # OPTIONS["TRACING"]: a span per run
        # Owned by the loop thread.
        self._async_starting: list[Starting] = []  # start this turn
        self._jobs: set[asyncio.Task[None]] = set()  # async tasks, and batches starting
        self._by_id: dict[uuid.UUID, asyncio.Task[None]] = {}  # running async tasks
        self._cancel_requested: set[uuid.UUID] = set()
        self._abandoned = False  # the shutdown timeout gave up on the running tasks

    # Starting (any thread) ----------------------------------------------------------------

    def start(self, rows: list[ClaimedRow], started: Receivers) -> None:
        """Start ``rows``, each of which has a slot: sync ones on the task threads, async ones
        on the loop, with ``started`` the task_started receivers. A row whose task cannot run
        fails, and its slot is freed."""
        async_starting: list[Starting] = []
        sync_starting: list[Starting] = []
        for row in rows:
            attempt = self._prepare(row)
            if attempt is not None:
                is_async = attempts.is_async(attempt.task)
                (async_starting if is_async else sync_starting).append((attempt, started))
        if sync_starting:
            self._threads.submit_many(self._run_sync, sync_starting)
        if async_starting:
            self._on_loop(self._start_async_soon, async_starting)

    def take_unstarted(self) -> list[ClaimedRow]:
        """Take back the sync tasks no thread has started yet (any thread)."""
        return [attempt.row for attempt, _ in self._threads.take_queued()]

    def threads_waiting(self) -> bool:
        """Add task threads for sync tasks that waited too long for one; return whether any
        still wait (then the claim loop checks again within ``spawn_after``)."""
        return self._threads.balance()

    @property
    def spawn_after(self) -> float:
        return self._threads.spawn_after

    def _on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` on the loop thread: now if this is it, else at its next turn."""
        if threading.get_ident() == self._loop_thread:
            fn(*args)  # no wake-up of the loop: it is running
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed during a forced stop
                self._loop.call_soon_threadsafe(fn, *args)

    # Loop thread --------------------------------------------------------------------------

    def _start_async_soon(self, starting: list[Starting]) -> None:
        """Start async tasks at the end of this turn of the loop, with the others started in it
        (tasks finishing together free their slots one by one: one signal hop for them all).
        Where task_started has only receivers that may run on the loop, start them now: no
        hop to the signal thread and back before their first line."""
        if all(started.on_the_loop for _, started in starting):
            _send_each(starting)
            self._run_each(starting)
            return
        if not self._async_starting:
            self._loop.call_soon(self._start_async_batch)
        self._async_starting.extend(starting)

    def _start_async_batch(self) -> None:
        starting, self._async_starting = self._async_starting, []
        self._track(self._loop.create_task(self._start_async(starting)))

    async def _start_async(self, starting: list[Starting]) -> None:
        """Send task_started for a batch of async tasks in one hop, then run them."""
        await asyncio.wrap_future(self._receivers.post(_send_each, starting))
        self._run_each(starting)

    def _run_each(self, starting: list[Starting]) -> None:
        for attempt, _ in starting:
            job = self._loop.create_task(self._run_async(attempt))
            self._track(job)
            self._by_id[attempt.row.id] = job
            job.add_done_callback(partial(self._forget, attempt.row.id))

    def _forget(self, task_id: uuid.UUID, _job: asyncio.Task[None]) -> None:
        self._by_id.pop(task_id, None)

    def _track(self, job: asyncio.Task[None]) -> None:
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def _run_async(self, attempt: Attempt) -> None:
        if self._supervisor is not None:  # it renews the lease while the task blocks the loop
            self._supervisor.async_started(attempt.row.id, attempt.policy.timeout)
        try:
            args, kwargs = attempt.call_args(self._reporter)
            try:
                if self._tracing is None:
                    value = await attempt.call_async(args, kwargs)
                else:
                    with self._tracing.run(attempt.row):
                        value = await attempt.call_async(args, kwargs)
            finally:
                if attempt.report is not None:
                    await aend_report(self._reporter, attempt.report)
            ended = outcomes.succeeded(attempt, value, self._max_result_bytes)
        except asyncio.CancelledError as e:
            if attempt.row.id in self._cancel_requested:
                cancelled = TaskCancelled("Cancelled while running, at the request of a user.")
                cancelled.__cause__ = e
                self._failed(attempt, cancelled)
            elif self._abandoned:
                raise  # cancelled by the shutdown timeout, and requeued already
            else:
                self._failed(attempt, e)
        except BaseException as e:
            self._failed(attempt, e)
        else:
            self._succeeded(ended)
        finally:
            if self._supervisor is not None:
                self._supervisor.async_ended(attempt.row.id)
            self._done(attempt.row.id)

    def cancel(self, task_id: uuid.UUID, waiting: ClaimedRow | None) -> None:
        """Act on a user's request to cancel a task: fail it before it starts if it was
        ``waiting`` for a slot (taken out of the wait); else cancel it if it runs on the loop,
        or have the supervisor stop it; a sync task without a supervisor runs to its end."""
        if waiting is not None:
            logger.warning("Cancelled task id=%s before it started, at a user's request", task_id)
            error = TaskCancelled("Cancelled before it started, at the request of a user.")
            self._completer.submit(outcomes.unstarted(waiting, error))
            return
        self._cancel_requested.add(task_id)
        job = self._by_id.get(task_id)
        if job is not None:
            job.cancel()
        elif self._supervisor is None or not self._supervisor.cancel(task_id):
            logger.warning(
                "Task id=%s was asked to cancel, but it is a sync task: it runs to its end",
                task_id,
            )
            return
        logger.warning("Cancelling task id=%s at a user's request", task_id)

    def abandon(self) -> None:
        """Cancel every async task: the shutdown timeout is over and they are requeued."""
        self._abandoned = True
        for job in list(self._jobs):
            job.cancel()

    @property
    def abandoned(self) -> bool:
        return self._abandoned

    # Task threads -------------------------------------------------------------------------

    def _run_sync(self, starting: Starting) -> None:
        """Run a sync task on this task thread, up to queueing its outcome."""
        attempt, started = starting
        row = attempt.row
        late = False
        try:
            started.send_for(attempt.result)
            timeout = attempt.policy.timeout
            if self._supervisor is not None:
                self._supervisor.sync_started(row.id, timeout)
            elif timeout is not None:
                self._loop.call_soon_threadsafe(
                    self._loop.call_later, timeout, self._sync_timed_out, attempt
                )
            try:
                args, kwargs = attempt.call_args(self._reporter)
                if getattr(attempt.task, "atomic", False):
                    if self._tracing is None:
                        late = self._run_atomic(attempt, args, kwargs)
                    else:
                        with self._tracing.run(row):
                            late = self._run_atomic(attempt, args, kwargs)
                    if attempt.report is not None:
                        end_report(self._reporter, attempt.report)
                    return
                if self._tracing is None:
                    returned = attempt.task.func(*args, **kwargs)
                else:
                    with self._tracing.run(row):
                        returned = attempt.task.func(*args, **kwargs)
                _exit_if_forked(self._pid, 0)
                if attempt.report is not None:
                    end_report(self._reporter, attempt.report)
                ended = outcomes.succeeded(attempt, returned, self._max_result_bytes)
            except BaseException as e:  # a task's SystemExit or KeyboardInterrupt fails it only
                _exit_if_forked(self._pid, 1)
                if attempt.report is not None:
                    end_report(self._reporter, attempt.report)
                late = timeout is not None and not attempt.settle()
                if not late:
                    self._failed(attempt, e)
            else:
                late = timeout is not None and not attempt.settle()
                if not late:
                    self._succeeded(ended)
        finally:
            if self._supervisor is not None:
                self._supervisor.sync_ended(row.id)
            if late:
                logger.warning("Task id=%s ended after its timeout; its result is ignored", row.id)
                self._threads.drop_stand_in()  # its stand-in thread is no longer needed
            else:
                self._done(row.id)

    def _run_atomic(self, attempt: Attempt, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Run an ``atomic=True`` task in a transaction that also stores its success, so that
        its database writes and its outcome commit together or not at all; return whether its
        timeout fired first (see ``atomic.run_atomic``). A task that raises is rolled back and
        fails as usual."""
        _exit = partial(_exit_if_forked, self._pid, 0)
        return run_atomic(self._completer, attempt, args, kwargs, self._max_result_bytes, _exit)

    def _sync_timed_out(self, attempt: Attempt) -> None:
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
        self._threads.add_stand_in()  # replace the thread the stuck task holds
        self._failed(attempt, attempt.timed_out())
        self._done(attempt.row.id)

    # Outcomes (any thread) ----------------------------------------------------------------

    def _prepare(self, row: ClaimedRow) -> Attempt | None:
        """Resolve ``row``'s task; None if it cannot run (it fails, and its slot is freed)."""
        try:
            return attempts.prepare(row, self._config)
        except Exception as e:
            logger.error("Task id=%s path=%s cannot run: %s", row.id, row.task_path, e)
            self._completer.submit(outcomes.unstarted(row, e))
            self._free_soon(row.id)
            return None

    def _free_soon(self, task_id: uuid.UUID) -> None:
        """Free the slot of a task that did not start, at the loop's next turn: freed here, it
        would start the next waiting task from inside ``start``, and a queue of tasks that
        cannot run would recurse."""
        if threading.get_ident() == self._loop_thread:
            self._loop.call_soon(self._done, task_id)
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed during a forced stop
                self._loop.call_soon_threadsafe(self._done, task_id)

    def _succeeded(self, ended: Ended) -> None:
        outcomes.log(ended, self._config.max_snoozes, self._sender)
        self._completer.submit(ended)

    def _failed(self, attempt: Attempt, exc: BaseException) -> None:
        if isinstance(exc, Suspended):  # put back to READY by the task's own thread
            self._suspended(attempt.row.id)
            outcomes.log_suspended(attempt, exc)
            return
        exc = attempts.from_task_frame(exc)
        ended = outcomes.after_error(attempt, exc, self._config.max_snoozes)
        outcomes.log(ended, self._config.max_snoozes, self._sender)
        self._completer.submit(ended)


# Whether this process is a fork's child: until one forks, a task's end asks for no pid.
_forked = False


def _note_fork() -> None:
    global _forked
    _forked = True


if hasattr(os, "register_at_fork"):  # POSIX only; Windows has no fork()
    os.register_at_fork(after_in_child=_note_fork)


def _exit_if_forked(pid: int, status: int) -> None:
    """End a child process that a task forked and that returned from the task: it holds a copy
    of the worker without its threads, and must neither write an outcome nor linger."""
    if _forked and os.getpid() != pid:
        os._exit(status)


def _send_each(starting: list[Starting]) -> None:
    for attempt, started in starting:
        started.send_for(attempt.result)
