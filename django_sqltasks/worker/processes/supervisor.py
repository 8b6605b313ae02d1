"""The supervisor of ``tasks_worker --processes N``: N worker processes, kept running.

It is one thread, with two database connections (its own queries', and on PostgreSQL the
``LISTEN`` it relays to its children: ``relay``), that never runs a task. Each child is a fresh
``python -m django tasks_worker`` process (started with exec, never a fork of this one) with
its own connections (``child``), and reports through a pipe (``pipe``) each task's start and
end, cancel requests, and heartbeats. From these the supervisor:

- restarts a child that dies, after rescuing its tasks (with backoff if it keeps dying);
- kills a child whose sync task runs past its timeout or is cancelled, writes that task
  FAILED itself, puts the child's other tasks back in the queue, and starts a replacement;
- kills a child whose async task runs ASYNC_GRACE past its timeout (its loop did not end it:
  the task blocks the loop), in the same way;
- renews its children's leases, so that a child whose task holds the GIL is not rescued;
- recycles a child after --max-tasks-per-child tasks or above --max-memory-per-child MB,
  starting its replacement first;
- touches --health-file while every child is healthy;
- stops them all on SIGTERM or SIGINT, and kills them on a second signal.
"""

from __future__ import annotations

import logging
import signal
import time
import uuid
from collections.abc import Mapping
from typing import Any

from django.db import connections

from ...compat import task_backends
from ...exceptions import TaskCancelled
from ...sql.retries import run_with_retries
from .. import events
from ..lease import EXIT_ID_IN_USE
from .child import Child, Children
from .health_file import touch
from .ledger import Ledger, describe_status, rss_bytes
from .pipe import Beat, CancelAsked, Event
from .relay import Relay
from .stopping import Stopping

logger = logging.getLogger("django_sqltasks")

TICK = 0.1  # seconds: how late a deadline may be enforced, at most
STABLE_AFTER = 30.0  # seconds: a child that lived this long did not die "at once"
FIRST_BACKOFF = 1.0  # seconds before restarting a child that died at once twice in a row
MAX_BACKOFF = 60.0  # seconds
MEMORY_EVERY = 1.0  # seconds between reads of the children's memory


class Supervisor:
    """Run ``processes`` worker processes of ``command`` (the child's tasks_worker options:
    ``queue_names``, ``concurrency`` and ``poll_interval`` among them, which its wake-ups
    follow)."""

    def __init__(
        self,
        *,
        command: list[str],
        processes: int,
        worker_id: str,
        backend: str = "default",
        burst: bool = False,
        shutdown_timeout: float | None = None,
        max_tasks_per_child: int | None = None,
        max_memory_per_child: int | None = None,  # MB
        health_file: str | None = None,
        queue_names: list[str] | None = None,
        concurrency: int = 1,
        poll_interval: float | None = None,
    ) -> None:
        task_backend: Any = task_backends[backend]
        config = task_backend.config
        self.command = command
        self.processes = processes
        self.worker_id = worker_id
        self.backend_name: str = task_backend.alias
        self.database: str = task_backend.database
        self.lease_timeout: float = config.lease_timeout
        self.interval: float = config.heartbeat_interval
        self.max_rescues: int | None = config.max_rescues
        self.burst = burst
        self.shutdown_timeout = shutdown_timeout
        self.max_tasks_per_child = max_tasks_per_child
        self.max_memory_bytes = None if max_memory_per_child is None else max_memory_per_child << 20
        self.health_file = health_file
        self._children = Children(worker_id, command)
        self._starts: list[float] = []  # monotonic times at which to start a child
        self._failures = 0  # children in a row that died soon after they started
        self._ledger = Ledger(
            database=self.database,
            backend_name=self.backend_name,
            lease_timeout=self.lease_timeout,
            max_rescues=self.max_rescues,
        )
        self._status = 0  # the exit status when no stop was forced (EXIT_ID_IN_USE, say)
        self._stopping = Stopping(self._children, self._ledger, shutdown_timeout)
        # PostgreSQL: one LISTEN for every child, each notification waking one of them.
        self._relay: Relay | None = None
        if Relay.wanted(self.database, config.notify):
            self._relay = Relay(
                self.database,
                config.listen_database,
                self._children,
                backend_name=self.backend_name,
                queue_names=queue_names,
                capacity=concurrency,
                poll_interval=poll_interval or config.poll_interval,
            )
            self._children.relayed = True
            self._children.on_started = self._relay.started

    def run(self) -> int:
        """Run until stopped (or, with ``burst``, until every child has exited); return the
        exit status: 0 after a graceful stop, 1 after a forced one, EXIT_ID_IN_USE when a
        process found its id taken by a live worker. Raise ``WorkerIdInUse`` if a live worker
        holds this supervisor's id, or that of a process it would start (``worker_id``-N): two
        supervisors of one id would take each other's workers for dead ones."""
        run_with_retries(self.database, lambda: self._ledger.refuse_live_ids(self.worker_id))
        self._children.wake_on_signals()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._stopping.on_signal)
        logger.info(
            "Supervisor started worker_id=%s processes=%d",
            self.worker_id,
            self.processes,
            extra={"action": "supervisor_start", "worker_id": self.worker_id},
        )
        if self._relay is not None:
            self._relay.tick()  # listen first: the children are told so as they start
        for _ in range(self.processes):
            self._children.start()
        next_beat = next_memory = time.monotonic()
        try:
            while True:
                for child in self._children.ready(TICK):
                    if child in self._children:
                        self._read(child)
                if self._relay is not None:
                    self._relay.tick()
                self._stopping.handle_signals()
                self._reap()
                self._enforce_deadlines()
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + self.interval
                    self._renew_leases()
                    self._touch_health()
                if self.max_memory_bytes is not None and now >= next_memory:
                    next_memory = now + MEMORY_EVERY
                    self._check_memory()
                self._ledger.flush()
                self._start_due()
                if self._stopping.asked:
                    if not self._children:
                        break
                    self._stopping.escalate()
                elif self.burst and not self._children and not self._starts:
                    break
        finally:
            signal.set_wakeup_fd(-1)
            if self._relay is not None:
                self._relay.close()
            connections.close_all()
        logger.info(
            "Supervisor stopped worker_id=%s",
            self.worker_id,
            extra={"action": "supervisor_stop", "worker_id": self.worker_id},
        )
        return 1 if self._stopping.forced else self._status

    # Children ------------------------------------------------------------------------------

    def _read(self, child: Child) -> bool:
        """Handle what ``child`` wrote; return whether it may write more now."""
        try:
            received = child.read()
        except EOFError:  # the child is gone
            self._children.closed(child)
            return False
        for event in received or ():
            if child in self._children:  # an event may have killed it
                self._on_event(child, event)
        return received is not None and child in self._children

    def _on_event(self, child: Child, event: Event) -> None:
        if isinstance(event, CancelAsked):
            error = TaskCancelled("Cancelled while running, at the request of a user.")
            self._kill_for(child, {event.task_id: error}, "task_cancelled")
            return
        child.note(event)
        limit = self.max_tasks_per_child
        if isinstance(event, Beat) and limit is not None and child.claimed >= limit:
            # It stops claiming at the limit (--max-tasks) and exits once they are done.
            self._retire(child, f"it claimed {child.claimed} tasks", stop=False)

    def _reap(self) -> None:
        for child in self._children.all():
            status = child.proc.poll()
            if status is None:
                continue
            self._read_rest(child)
            if child not in self._children:
                continue  # an event it sent last had it killed, and handled
            self._children.forget(child)
            lived = time.monotonic() - child.born
            if status == EXIT_ID_IN_USE:
                # Another worker took the id after the check at start: stop, or each restart
                # would be refused again. Its row, and its tasks, stay with that worker.
                logger.error(
                    "Worker process pid=%d worker_id=%s found its id in use by a live worker; "
                    "stopping",
                    child.proc.pid,
                    child.worker_id,
                    extra={"action": "worker_id_in_use", "worker_id": child.worker_id},
                )
                self._status = EXIT_ID_IN_USE
                self._stopping.ask()
                continue
            if child.retiring or self._stopping.asked:
                # Whatever its status: a process that exits mid-task, even with 0, leaves tasks.
                self._rescue(child, "stopped" if status == 0 else "died while stopping")
                continue
            if status == 0:
                # It stopped at --max-tasks-per-child before a beat said so, or a task ended
                # the process (sys.exit(0) in a thread does not; os._exit(0) does): rescue what
                # it may have left RUNNING now, not a lease later.
                self._rescue(child, "exited with status 0")
                if not self.burst:
                    self._retire(child, "it exited (status 0)", stop=False)
                continue
            self._rescue(child, "died")
            self._failures = self._failures + 1 if lived < STABLE_AFTER else 1
            delay = (
                0.0
                if self._failures < 2
                else min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** (self._failures - 2))
            )
            logger.error(
                "Worker process pid=%d worker_id=%s exited with %s after %.1fs; restarting it "
                "in %.1fs",
                child.proc.pid,
                child.worker_id,
                describe_status(status),
                lived,
                delay,
                extra={"action": "child_died", "worker_id": child.worker_id, "status": status},
            )
            self._starts.append(time.monotonic() + delay)
            events.emit(
                "child_died",
                worker_id=child.worker_id,
                pid=child.proc.pid,
                status=status,
                delay=delay,
            )

    def _read_rest(self, child: Child) -> None:
        while self._read(child):
            pass

    def _start_due(self) -> None:
        if self._stopping.asked:
            self._starts.clear()
            return
        now = time.monotonic()
        due = [at for at in self._starts if at <= now]
        self._starts = [at for at in self._starts if at > now]
        for _ in due:
            self._children.start()

    def _retire(self, child: Child, why: str, *, stop: bool) -> None:
        """Start a replacement for ``child``, then let it stop (SIGTERM if ``stop``)."""
        if child.retiring or self._stopping.asked:
            return
        child.retiring = True
        logger.info(
            "Recycling worker process pid=%d worker_id=%s: %s; its replacement starts first",
            child.proc.pid,
            child.worker_id,
            why,
            extra={"action": "child_recycle", "worker_id": child.worker_id},
        )
        self._children.start()
        if stop:
            child.proc.send_signal(signal.SIGTERM)

    def _check_memory(self) -> None:
        assert self.max_memory_bytes is not None
        for child in self._children.all():
            rss = rss_bytes(child.proc.pid)
            if rss is not None and rss > self.max_memory_bytes:
                self._retire(child, f"it uses {rss >> 20} MB", stop=True)

    # Hard stops ----------------------------------------------------------------------------

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for child in self._children.all():
            if not any(at <= now for at in child.deadlines.values()):
                continue
            if not self._read(child) and child not in self._children:
                continue  # it was killed for a cancel it sent meanwhile
            late = child.overdue(now)  # not those that ended meanwhile: _read dropped them
            if late:
                self._kill_for(child, late, "task_timeout")

    def _kill_for(self, child: Child, errors: Mapping[uuid.UUID, Exception], action: str) -> None:
        """Kill ``child`` to stop the tasks of ``errors``, fail each with its error, put the
        child's other tasks back in the queue, and start a replacement."""
        for task_id, error in errors.items():
            logger.error(
                "Task id=%s: %s Killing worker process pid=%d worker_id=%s and putting its "
                "other tasks back in the queue",
                task_id,
                error,
                child.proc.pid,
                child.worker_id,
                extra={"action": action, "task_id": task_id, "worker_id": child.worker_id},
            )
        self._children.kill(child)
        reason = (
            f"Worker process {child.worker_id} was stopped to end task(s) "
            f"{', '.join(map(str, errors))} before this task finished."
        )
        self._ledger.end_tasks(child.worker_id, child.proc.pid, errors, reason)
        events.emit(
            "child_killed",
            worker_id=child.worker_id,
            pid=child.proc.pid,
            tasks=[str(t) for t in errors],
            action=action,
        )
        if not child.retiring and not self._stopping.asked:
            self._children.start()

    def _rescue(self, child: Child, how: str) -> None:
        """Rescue the tasks of a child that is gone, as its lease running out would (a task
        that keeps killing its worker fails after MAX_RESCUES)."""
        self._ledger.rescue(child.worker_id, child.proc.pid, how)

    # Leases and health ---------------------------------------------------------------------

    def _renew_leases(self) -> None:
        """Renew the lease of each healthy child: a child whose task (sync or async) holds the
        GIL cannot heartbeat, and must not be rescued while it runs. A child that withholds its
        lease, or that is silent with no task running (frozen, deadlocked), is left to lapse."""
        renewed = [c.worker_id for c in self._children.all() if c.healthy(self.lease_timeout)]
        self._ledger.renew(renewed)
        events.emit("leases_renewed", worker_ids=renewed)

    def _touch_health(self) -> None:
        if self.health_file is None or self._stopping.asked:
            return
        active = [c for c in self._children.all() if not c.retiring]
        if len(active) >= self.processes and all(c.healthy(self.lease_timeout) for c in active):
            touch(self.health_file)
