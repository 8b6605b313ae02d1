"""The worker's parts on their own: the completer, the task thread pool, the lease, and the
heartbeat that withholds the lease from a worker that makes no progress."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus, task_backends
from django_sqltasks.models import TaskRecord, WorkerRecord
from django_sqltasks.sql import Outcome
from django_sqltasks.worker import identity, liveness, threads
from django_sqltasks.worker.completer import MAX_BATCH, Completer
from django_sqltasks.worker.lease import Lease, WorkerIdInUse
from django_sqltasks.worker.liveness import FailingRoles
from django_sqltasks.worker.maintenance import Maintenance
from django_sqltasks.worker.outcomes import Ended
from django_sqltasks.worker.threads import ReceiverThread, TaskThreads, _Look
from tests.conftest import Clock, wait_for
from tests.factories import task_row, worker_lease

WORKER = "parts-worker"
OUTCOME_NOT_STORED = "django_sqltasks.exceptions.OutcomeNotStored"


# The completer -------------------------------------------------------------------------------


class Completing:
    """A completer on its own writer thread, as a worker wires it."""

    def __init__(self) -> None:
        self.writer = ThreadPoolExecutor(1)
        self.receivers = ReceiverThread()
        self.receivers.start()
        self.stopping = threading.Event()
        self.failing = FailingRoles()
        self.completer = Completer(
            database="default",
            worker_id=WORKER,
            executor=self.writer,
            receivers=self.receivers,
            sender=type(task_backends["default"]),
            failing=self.failing,
            stopping=self.stopping,
        )

    def close(self) -> None:
        self.stopping.set()
        self.writer.submit(connections.close_all).result()
        self.writer.shutdown()
        self.receivers.stop(timeout=5)


@pytest.fixture
def completing() -> Any:
    parts = Completing()
    yield parts
    parts.close()


def _running(count: int) -> list[uuid.UUID]:
    return [task_row(TaskResultStatus.RUNNING, owner=WORKER).id for _ in range(count)]


def _succeeded(task_id: uuid.UUID, value: str = "1") -> Ended:
    """A task's success, as a worker's completer gets it (no attempt: nothing to report)."""
    outcome = Outcome(
        id=task_id,
        status=TaskResultStatus.SUCCESSFUL,
        finished_at=timezone.now(),
        return_value=value,
    )
    return Ended(outcome)


@pytest.mark.django_db(transaction=True)
def test_the_completer_writes_many_outcomes_in_batches(completing: Completing) -> None:
    ids = _running(MAX_BATCH + 100)
    for task_id in ids:
        completing.completer.submit(_succeeded(task_id))
    assert completing.completer.wait_idle(30)
    assert completing.completer.written == len(ids)
    assert completing.completer.pending_ids() == set()
    assert TaskRecord.objects.succeeded().count() == len(ids)
    assert not TaskRecord.objects.filter(owner=WORKER).exists()


@pytest.mark.django_db(transaction=True)
def test_the_completer_salvages_an_outcome_the_database_refuses(completing: Completing) -> None:
    """A return value that is not JSON (the database's JSON check refuses it) fails its own
    task as OutcomeNotStored; the outcomes written with it are stored."""
    ids = _running(5)
    bad = ids[2]
    for task_id in ids:
        completing.completer.submit(_succeeded(task_id, "{not json" if task_id == bad else "1"))
    assert completing.completer.wait_idle(30)
    record = TaskRecord.objects.get(id=bad)
    assert record.status == TaskResultStatus.FAILED and record.owner is None
    assert record.errors[-1]["exception_class_path"] == OUTCOME_NOT_STORED
    assert "refused this task's outcome" in record.errors[-1]["traceback"]
    assert TaskRecord.objects.succeeded().filter(id__in=ids).count() == 4
    assert completing.failing.stalled(-1) == []


@pytest.mark.django_db(transaction=True)
def test_the_completer_skips_tasks_it_no_longer_holds(completing: Completing) -> None:
    """A task rescued and claimed by another worker meanwhile keeps that worker's state."""
    (mine,) = _running(1)
    theirs = task_row(TaskResultStatus.RUNNING, owner="another-worker").id
    completing.completer.submit(_succeeded(mine))
    completing.completer.submit(_succeeded(theirs))
    assert completing.completer.wait_idle(30)
    assert TaskRecord.objects.get(id=mine).status == TaskResultStatus.SUCCESSFUL
    other = TaskRecord.objects.get(id=theirs)
    assert other.status == TaskResultStatus.RUNNING and other.owner == "another-worker"


# The task thread pool ------------------------------------------------------------------------


def test_the_pool_runs_everything_submitted_in_order_on_few_threads() -> None:
    pool = TaskThreads(8)
    seen: list[int] = []
    done = threading.Event()

    def run(n: int) -> None:
        seen.append(n)
        if n == 999:
            done.set()

    pool.submit_many(run, list(range(1000)))
    assert done.wait(10)
    pool.stop()
    assert sorted(seen) == list(range(1000))
    assert pool.started <= 2  # fast tasks do not need more threads than the first two


def test_the_pool_adds_threads_for_blocked_tasks_up_to_its_size() -> None:
    pool = TaskThreads(4, spawn_after=0.01)
    release = threading.Event()
    running = []

    def block(n: int) -> None:
        running.append(n)
        release.wait(10)

    pool.submit_many(block, list(range(6)))
    wait_for(lambda: not pool.balance() or len(running) >= 4, timeout=5)
    wait_for(lambda: len(running) == 4, timeout=5)
    assert pool.started == 4
    release.set()
    wait_for(lambda: len(running) == 6, timeout=5)
    pool.stop()


def test_the_pool_adds_threads_for_short_blocking_tasks_that_keep_threads_busy() -> None:
    """Tasks that block 10 ms each, taken every 5 ms by two threads: the queue's head waits
    far longer than spawn_after, so threads are added (they used to stay at two)."""
    pool = TaskThreads(50, spawn_after=0.02)
    done = threading.Event()
    count = 300

    def block(n: int) -> None:
        time.sleep(0.01)
        if n == count - 1:
            done.set()

    started = time.monotonic()
    pool.submit_many(block, list(range(count)))
    while not done.is_set() and time.monotonic() - started < 30:
        pool.balance()  # the claim loop calls it while tasks wait
        time.sleep(0.02)
    pool.stop()
    assert done.is_set()
    # Two threads would take 1.5 s (300 x 10 ms / 2); the thread count shows the pool grew
    # without timing the run, which a busy machine would stretch.
    assert pool.started > 10, f"{pool.started} threads for {count} blocking tasks"


def _look(at: float, cpu: float, taken: int, ran: float, waited: float) -> _Look:
    """One look at two task threads, each with ``ran`` and ``waited`` seconds so far."""
    return _Look(at, cpu, taken, {1: (ran, waited), 2: (ran, waited)})


@pytest.mark.parametrize(
    ("now", "blocked"),
    [
        # Tasks taken, threads asleep (I/O, sleeps) while the process is mostly idle: add.
        (_look(1.1, 0.01, 40, 0.001, 0.001), True),
        # None taken, every thread held by a task that sleeps: add.
        (_look(1.1, 0.01, 10, 0.001, 0.001), True),
        # Tasks taken, threads waiting for a CPU (a loaded machine): threads would not help.
        (_look(1.1, 0.01, 40, 0.005, 0.09), False),
        # None taken, but only for want of a CPU: the same.
        (_look(1.1, 0.01, 10, 0.005, 0.09), False),
        # Tasks taken, threads asleep while the process keeps a CPU busy: waiting for the GIL.
        (_look(1.1, 0.09, 40, 0.04, 0.001), False),
        # Where the counts cannot be read: a waiting queue is enough, as it was.
        (_Look(1.1, 0.01, 40, None), True),
    ],
)
def test_the_pool_adds_threads_only_for_threads_that_are_blocked(now: _Look, blocked: bool) -> None:
    pool = TaskThreads(8, spawn_after=0.02)
    assert pool._judge(_look(1.0, 0.0, 10, 0.0, 0.0)) is False  # a first look: judge later
    assert pool._judge(now) is blocked


def test_the_pool_adds_threads_for_tasks_that_run_at_once_while_cpus_are_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two threads each on a CPU the whole time (tasks that free the GIL): with 8 CPUs, more
    threads can use more of them; with 2, none is left."""
    for cpus, blocked in ((8, True), (2, False)):
        monkeypatch.setattr(threads, "_cpus", lambda cpus=cpus: cpus)
        pool = TaskThreads(8, spawn_after=0.02)
        pool._judge(_look(1.0, 0.0, 10, 0.0, 0.0))
        assert pool._judge(_look(1.1, 0.2, 40, 0.1, 0.0)) is blocked


def test_the_pool_judges_no_look_that_may_span_idle_time() -> None:
    pool = TaskThreads(8, spawn_after=0.02)
    pool._judge(_look(1.0, 0.0, 10, 0.0, 0.0))
    assert pool._judge(_look(5.0, 0.01, 40, 0.001, 0.001)) is False
    assert pool._judge(_look(5.1, 0.02, 80, 0.002, 0.002)) is True


def test_the_pool_gives_back_tasks_no_thread_has_taken() -> None:
    pool = TaskThreads(1, spawn_after=3600)
    taken, release = threading.Event(), threading.Event()

    def hold(n: int) -> None:
        taken.set()
        release.wait(10)

    pool.submit_many(hold, [0])
    assert taken.wait(10), "the pool's thread never took task 0"
    pool.submit_many(lambda n: None, [1, 2, 3])
    assert pool.take_queued() == [1, 2, 3]
    release.set()
    pool.stop()


def test_stand_ins_change_the_size_under_the_lock_from_any_thread() -> None:
    pool = TaskThreads(10)

    def churn() -> None:
        for _ in range(2000):
            pool.add_stand_in()
            pool.drop_stand_in()

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert pool.size == 10
    pool.stop()


class OneThread:
    """A one-thread task pool whose tasks note whether their thread's connection was open when
    they started (``seen``), then run a query, then call what they were given (if not None)."""

    def __init__(self) -> None:
        self.pool = TaskThreads(1, spawn_after=3600)
        self.seen: list[bool] = []
        self._done = threading.Semaphore(0)

    def run(self, *tasks: Any) -> None:
        """Queue ``tasks`` at once, and wait until they have run."""
        self.pool.submit_many(self._run, list(tasks))
        for _ in tasks:
            assert self._done.acquire(timeout=30), f"the pool ran {len(self.seen)} tasks"

    def _run(self, task: Any) -> None:
        try:
            self.seen.append(connection.connection is not None)
            TaskRecord.objects.exists()
            if task is not None:
                task()
        finally:
            self._done.release()


@pytest.fixture
def one_thread() -> Any:
    runner = OneThread()
    yield runner
    runner.pool.stop()


@pytest.mark.django_db(transaction=True)
def test_a_task_thread_keeps_its_connection_for_its_next_task(
    one_thread: OneThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONN_MAX_AGE is 0 here, as by default: Django would close the connection after each
    request. A thread's next task reuses it, queued behind the last or coming while the thread
    waits (a stream of durable tasks opened one connection a run)."""
    assert connection.settings_dict["CONN_MAX_AGE"] == 0
    monkeypatch.setattr(threads, "IDLE_CLOSE", 3600)
    one_thread.run(None, None, None)
    wait_for(lambda: one_thread.pool._idle == 1, timeout=30)  # the thread waits for work
    one_thread.run(None)
    assert one_thread.seen == [False, True, True, True]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="ends a session by its pid")
@pytest.mark.django_db(transaction=True)
def test_a_kept_connection_the_server_ended_is_opened_again_for_the_next_task(
    one_thread: OneThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(threads, "IDLE_CLOSE", 3600)
    pids: list[int] = []

    def note_pid() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pids.append(cursor.fetchone()[0])

    one_thread.run(note_pid)
    wait_for(lambda: one_thread.pool._idle == 1, timeout=30)
    with connection.cursor() as cursor:  # as an idle timeout or a restart would
        cursor.execute("SELECT pg_terminate_backend(%s)", [pids[0]])
        assert cursor.fetchone()[0]

    def ended() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pids[0]])
            return bool(cursor.fetchone()[0] == 0)

    wait_for(ended, timeout=30)
    one_thread.run(note_pid)  # its query would fail on the dead session
    assert one_thread.seen == [False, False]  # the ended one was closed before the task
    assert len(pids) == 2 and pids[1] != pids[0]


@pytest.mark.django_db(transaction=True)
def test_a_task_thread_closes_its_connection_once_it_waited_for_work(
    one_thread: OneThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = threading.Event()
    close = threads.close_used_connections

    def close_and_tell() -> None:
        close()
        closed.set()

    monkeypatch.setattr(threads, "IDLE_CLOSE", 0.01)
    monkeypatch.setattr(threads, "close_used_connections", close_and_tell)
    one_thread.run(None, None)
    assert closed.wait(30), "the idle thread did not close its connection"
    one_thread.run(None)
    assert one_thread.seen == [False, True, False]


@pytest.mark.django_db(transaction=True)
def test_a_task_that_leaves_a_transaction_open_gives_the_next_a_new_connection(
    one_thread: OneThread,
) -> None:
    def leave_a_transaction_open() -> None:
        connection.set_autocommit(False)
        TaskRecord.objects.exists()

    autocommit: list[bool] = []
    one_thread.run(
        leave_a_transaction_open, lambda: autocommit.append(connection.get_autocommit()), None
    )
    assert one_thread.seen == [False, False, True]
    assert autocommit == [True]


# The lease -----------------------------------------------------------------------------------


def _lease(worker_id: str = WORKER, timeout: float = 30) -> Lease:
    return worker_lease(worker_id, concurrency=4, timeout=timeout)


@pytest.mark.django_db
def test_a_lease_refuses_the_id_of_a_live_worker() -> None:
    _lease().register()
    # The row of a live process of this host (this test's parent), or of another host.
    me = identity.this_process()
    parent = identity.ProcessIdentity(
        me.boot_id, me.pid_namespace, identity.start_ticks(str(os.getppid())), "parent"
    )
    WorkerRecord.objects.filter(id=WORKER).update(
        pid=os.getppid(), process=parent.text(), heartbeat_at=timezone.now() - timedelta(seconds=12)
    )
    with pytest.raises(WorkerIdInUse, match=r"--worker-id: .* is in use by a live worker") as e:
        _lease().register()
    # Why a restart under the same id is refused, and for how long: the rest of the lease.
    assert "this worker's previous run" in str(e.value)
    assert re.search(r"runs out in about 1[78]s \(LEASE_TIMEOUT\)", str(e.value)), str(e.value)
    # Its pid, and a start time not its own: the pid was reused, the row's process is gone.
    reused = identity.ProcessIdentity(me.boot_id, me.pid_namespace, "1", "gone")
    WorkerRecord.objects.filter(id=WORKER).update(pid=os.getppid(), process=reused.text())
    _lease().register()
    # A row of an earlier version (no process stored): host and pid alone.
    WorkerRecord.objects.filter(id=WORKER).update(pid=os.getppid(), process="")
    with pytest.raises(WorkerIdInUse):
        _lease().register()
    WorkerRecord.objects.filter(id=WORKER).update(hostname="another-host", pid=os.getpid())
    with pytest.raises(WorkerIdInUse):
        _lease().register()


@pytest.mark.django_db(transaction=True)
def test_a_lease_takes_over_the_id_of_a_dead_process_of_this_host() -> None:
    """A worker restarted under its id (by a service manager) rescues its predecessor's tasks
    at once, when that process is gone from this host, instead of waiting for its lease."""
    _lease().register()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    WorkerRecord.objects.filter(id=WORKER).update(pid=dead.pid)
    orphan = task_row(TaskResultStatus.RUNNING, owner=WORKER).id
    task_row(TaskResultStatus.RUNNING, owner=WORKER)  # beside it: either may have killed it
    _lease().register()
    record = TaskRecord.objects.get(id=orphan)
    assert (record.status, record.owner) == (TaskResultStatus.READY, None)
    assert "beside the other tasks that lost a worker" in record.errors[-1]["traceback"]
    assert WorkerRecord.objects.get(id=WORKER).pid == os.getpid()


@pytest.mark.django_db
def test_a_heartbeat_registers_again_when_its_row_is_gone() -> None:
    lease = _lease()
    lease.register()
    WorkerRecord.objects.all().delete()
    lease.heartbeat()
    assert WorkerRecord.objects.filter(id=WORKER).exists()


@pytest.mark.django_db
def test_a_lease_rescues_the_tasks_of_a_silent_worker_and_reads_cancel_requests() -> None:
    dead = _lease("dead-worker")
    dead.register()
    WorkerRecord.objects.filter(id="dead-worker").update(
        heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    orphan = task_row(TaskResultStatus.RUNNING, owner="dead-worker").id
    mine = task_row(TaskResultStatus.RUNNING, owner=WORKER, cancel_requested=True).id
    lease = _lease()
    lease.register()  # registering rescues too
    record = TaskRecord.objects.get(id=orphan)
    assert record.status == TaskResultStatus.READY and record.owner is None
    assert record.errors[-1]["exception_class_path"] == "django_sqltasks.exceptions.WorkerLost"
    assert lease.cancel_requests() == [mine]
    assert not WorkerRecord.objects.filter(id="dead-worker").exists()


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_makes_no_progress_stops_renewing_its_lease(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = _lease(timeout=30)
    lease.register()
    # Time is data, not a wait: the lease was renewed ten seconds ago, so a renewal shows
    # whatever the clock's resolution, and the outcome writer failed a minute ago (below),
    # twice the lease's timeout.
    renewed = timezone.now() - timedelta(seconds=10)
    WorkerRecord.objects.filter(id=WORKER).update(heartbeat_at=renewed)
    failing = FailingRoles()
    db = ThreadPoolExecutor(1)
    maintenance = Maintenance(
        backend=task_backends["default"],
        lease=lease,
        db=db,
        failing=failing,
        stopped=threading.Event(),
        on_cancel_requested=lambda ids: None,
    )
    try:
        before = WorkerRecord.objects.get(id=WORKER).heartbeat_at
        with monkeypatch.context() as clock:
            clock.setattr(liveness, "time", Clock(ahead=-60))
            failing.failed("writing outcomes")
        with caplog.at_level(logging.ERROR, logger="django_sqltasks"):
            maintenance.beat()
        assert WorkerRecord.objects.get(id=WORKER).heartbeat_at == before
        assert "Not renewing the lease" in caplog.text
        assert re.search(r"writing outcomes has failed for 6\ds", caplog.text)
        failing.succeeded("writing outcomes")
        maintenance.beat()
        assert WorkerRecord.objects.get(id=WORKER).heartbeat_at > before
    finally:
        db.submit(connections.close_all).result()
        db.shutdown()
    assert connection.vendor  # the test's own connection is untouched
