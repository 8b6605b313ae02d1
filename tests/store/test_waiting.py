"""Waiting for a task to finish: ``result.wait()`` and ``await result.await_result()``."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import DatabaseError, OperationalError, connection, connections, transaction
from django.utils import timezone

from django_sqltasks.compat import TaskResultDoesNotExist, TaskResultStatus, task_backends
from django_sqltasks.exceptions import WaitTimeout
from django_sqltasks.models import TaskRecord
from django_sqltasks.sql import dialect_for
from django_sqltasks.sql.broken import drop
from django_sqltasks.sql.rows import SUSPECT
from django_sqltasks.store import finished
from django_sqltasks.store.waiting import watcher_of
from tests import tasks, tasks_wait
from tests.conftest import WorkerProcess
from tests.events import EventLog, Gate

StartWorker = Callable[..., WorkerProcess]
CANCELLED = "django_sqltasks.exceptions.TaskCancelled"
UNKNOWN_THREAD = 1094  # MySQL/MariaDB: KILL of a session that has ended


class Registered:
    """Counts waits as they register with their watcher; ``wait`` blocks until ``n`` have."""

    def __init__(self) -> None:
        self.count = 0
        self.threads: set[threading.Thread] = set()  # the watchers' threads, as seen then
        self._condition = threading.Condition()

    def added(self, thread: threading.Thread | None) -> None:
        with self._condition:
            self.count += 1
            if thread is not None:
                self.threads.add(thread)
            self._condition.notify_all()

    def wait(self, n: int = 1, timeout: float = 30) -> None:
        with self._condition:
            assert self._condition.wait_for(lambda: self.count >= n, timeout), (
                f"{self.count} of {n} waits registered"
            )


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registered]:
    """Counts registered waits; stops the watchers after the test (closing their connections
    before the test database goes)."""
    counter = Registered()
    add = finished.Watcher.add

    def counting_add(self: finished.Watcher, *args: Any, **kwargs: Any) -> finished.Waiter:
        waiter = add(self, *args, **kwargs)
        counter.added(self._thread)
        return waiter

    monkeypatch.setattr(finished.Watcher, "add", counting_add)
    try:
        yield counter
    finally:
        finished.stop_all()


class InThread:
    """Runs ``fn`` on a thread (closing its connections after); ``join`` returns its value or
    raises its exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._fn = fn
        self._outcome: list[Any] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._outcome.append((True, self._fn()))
        except BaseException as e:
            self._outcome.append((False, e))
        finally:
            connections.close_all()

    def join(self, timeout: float = 60) -> Any:
        self._thread.join(timeout)
        assert self._outcome, f"still waiting after {timeout}s"
        ok, value = self._outcome[0]
        if not ok:
            raise value
        return value


def backend() -> Any:
    return task_backends["default"]


@pytest.mark.worker_process_core  # NOTIFY on PostgreSQL, polling elsewhere
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fail", [False, True], ids=["successful", "failed"])
def test_wait_returns_when_a_worker_process_ends_the_task(
    fail: bool,
    worker_process: StartWorker,
    events: EventLog,
    gate: Gate,
    registered: Registered,
) -> None:
    result = tasks_wait.wait_at_then.enqueue(gate.path, fail=fail)
    worker_process("--concurrency", "1")
    events.wait("note", what="start")
    waiting = InThread(lambda: result.wait(timeout=60))
    registered.wait()
    gate.open()
    assert waiting.join() is result
    if fail:
        assert result.status == TaskResultStatus.FAILED
        assert result.errors[-1].exception_class_path == "builtins.ValueError"
    else:
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == "done"


@pytest.mark.django_db(transaction=True)
def test_async_wait_returns_when_the_task_is_cancelled(registered: Registered) -> None:
    result = tasks.add.enqueue(1, 2)

    async def wait() -> Any:
        return await result.await_result(timeout=60)

    waiting = InThread(lambda: asyncio.run(wait()))
    registered.wait()
    started = time.monotonic()
    assert backend().cancel(result.id)
    assert waiting.join() is result
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == CANCELLED
    if connection.vendor == "postgresql":  # woken by the cancel's NOTIFY, not a sweep
        assert time.monotonic() - started < finished.SAFETY_POLL


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["sync", "async"])
def test_wait_raises_wait_timeout_at_about_the_timeout(how: str, registered: Registered) -> None:
    result = tasks.add.enqueue(1, 2)
    started = time.monotonic()

    def wait() -> Any:
        if how == "sync":
            return result.wait(timeout=0.3)
        return asyncio.run(result.await_result(timeout=0.3))

    with pytest.raises(WaitTimeout) as caught:
        wait()
    elapsed = time.monotonic() - started
    # Never before the timeout; the upper bound only says the wait ended by it, not by a hang
    # (a loaded machine may be late to wake the waiter).
    assert 0.3 <= elapsed < 10, elapsed
    assert isinstance(caught.value, TimeoutError)
    assert caught.value.result.status == TaskResultStatus.READY
    assert str(caught.value) == f"Task {result.id} did not finish within 0.3s (it is READY)."
    assert registered.count == 1
    assert watcher_of(backend()).waiting == 0


@pytest.mark.django_db(transaction=True)
def test_an_already_finished_result_returns_at_once(registered: Registered) -> None:
    result = tasks.add.enqueue(1, 2)
    TaskRecord.objects.filter(id=result.id).update(status=TaskResultStatus.SUCCESSFUL)
    assert result.wait(timeout=0) is result
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert asyncio.run(result.await_result(timeout=0)).status == TaskResultStatus.SUCCESSFUL
    assert backend().wait_result(result.id).status == TaskResultStatus.SUCCESSFUL
    assert registered.count == 0  # no watcher, no thread, no connection
    ready = tasks.add.enqueue(1, 2)
    with pytest.raises(WaitTimeout):
        ready.wait(timeout=0)
    assert registered.count == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "result_id", ["not-a-uuid", "\ud800", "\x00", "6f1c1e58-5d3a-4c37-9a55-0c1f3a1e2b7d"]
)
def test_waiting_on_an_unknown_id_raises_task_result_does_not_exist(result_id: str) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        backend().wait_result(result_id, timeout=1)
    with pytest.raises(TaskResultDoesNotExist):
        asyncio.run(backend().await_result(result_id, timeout=1))


@pytest.mark.django_db(transaction=True)
def test_a_missed_notification_is_caught_by_the_last_read(
    registered: Registered, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task finished with no NOTIFY (written here by hand): the wait returns it, by a poll
    or by the read at its timeout, and does not raise."""
    monkeypatch.setattr(finished, "SAFETY_POLL", 600.0)
    result = tasks.add.enqueue(1, 2)
    waiting = InThread(lambda: result.wait(timeout=1.0))
    registered.wait()
    TaskRecord.objects.filter(id=result.id).update(status=TaskResultStatus.SUCCESSFUL)
    assert waiting.join().status == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize(
    ("timeout", "error", "rule"),
    [
        (-1, ValueError, "from 0 to"),
        (math.nan, ValueError, "finite"),
        (math.inf, ValueError, "finite"),
        (1e300, ValueError, "from 0 to 3.16224e+07"),
        ("5", TypeError, "number of seconds"),
        (True, TypeError, "number of seconds"),
    ],
)
def test_a_bad_timeout_is_refused_naming_the_rule(timeout: Any, error: type, rule: str) -> None:
    with pytest.raises(error, match=r"^timeout must be") as caught:
        backend().wait_result("00000000-0000-0000-0000-000000000000", timeout=timeout)
    assert rule in str(caught.value)
    with pytest.raises(error, match=r"^timeout must be"):
        asyncio.run(backend().await_result("00000000-0000-0000-0000-000000000000", timeout))


def _session_count() -> int:
    """Sessions open on the test database (the server's count; SQLite: none to count)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            )
        elif connection.vendor == "mysql":
            cursor.execute(
                "SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE()"
            )
        else:
            return 0
        return int(cursor.fetchone()[0])


@pytest.mark.load
@pytest.mark.django_db(transaction=True)
def test_ten_thousand_async_waiters_share_one_connection_and_all_return(
    registered: Registered,
) -> None:
    """10,000 waits asleep at once share the watcher's connection (and the few the async reads
    share: not one a waiter), and all return when their tasks finish in one statement, as a
    worker's outcome batch finishes them: on PostgreSQL woken by its notifications (200 ids
    each), elsewhere by the watcher's polls. Nothing here depends on how fast the machine is:
    the test waits until every wait has registered (each reads its row first), then ends them."""
    n = 10_000
    results = backend().enqueue_many(tasks.add, [((i, i), {}) for i in range(n)])
    before = _session_count()
    threads_before = threading.active_count()

    async def wait_all() -> list[Any]:
        waits = [r.await_result(timeout=600) for r in results]
        return await asyncio.gather(*waits, return_exceptions=True)

    waiting = InThread(lambda: asyncio.run(wait_all()))
    registered.wait(n, timeout=600)  # every wait asleep at once
    during = _session_count()
    threads_during = threading.active_count()
    with transaction.atomic():
        finished_now = TaskRecord.objects.filter(status=TaskResultStatus.READY).update(
            status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now(), return_value=0
        )
        with connection.cursor() as cursor:
            dialect_for(connection).announce_finished(cursor, [uuid.UUID(r.id) for r in results])
    assert finished_now == n
    outcomes = waiting.join(600)
    assert len(outcomes) == n
    assert {type(o) for o in outcomes} == {type(results[0])}, {type(o) for o in outcomes}
    assert {o.status for o in outcomes} == {TaskResultStatus.SUCCESSFUL}
    # The watcher's connection, and the few the async reads share: not one per waiter.
    assert during - before <= 6, (before, during)
    assert threads_during - threads_before <= 4, (threads_before, threads_during)


@pytest.mark.load
@pytest.mark.django_db(transaction=True)
def test_ten_thousand_async_waiters_that_time_out_each_raise_and_leave_nothing_behind(
    registered: Registered, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10,000 waits on tasks no worker runs, all asleep at once, all past their timeout
    together: each raises ``WaitTimeout`` naming its task (after its last read, 10,000 reads
    at one moment), none is left registered, and the watcher, idle, ends its thread and closes
    its connection. The test waits until every wait has registered before the timeouts can
    matter: each has 600 s to register and then times out when the test says (by a deadline
    moved to now), so a slow machine changes nothing."""
    monkeypatch.setattr(finished, "IDLE_CLOSE", 0.05)
    n = 10_000
    results = backend().enqueue_many(tasks.add, [((i, i), {}) for i in range(n)])
    real_monotonic = time.monotonic
    monkeypatch.setattr(
        "django_sqltasks.store.waiting.time.monotonic",
        lambda: real_monotonic() + JumpingLoop.offset,
    )
    before = _session_count()

    async def wait_all() -> list[Any]:
        waits = [r.await_result(timeout=600) for r in results]
        return await asyncio.gather(*waits, return_exceptions=True)

    loop = JumpingLoop()
    waiting = InThread(lambda: loop.run_until_complete(wait_all()))
    registered.wait(n, timeout=600)  # every wait asleep at once
    watcher = watcher_of(backend())
    assert watcher.waiting == n
    # Every deadline passes at once: the waits' clock and the loop's jump past it, and a
    # no-op call wakes the loop to see its timers due.
    monkeypatch.setattr(JumpingLoop, "offset", 601.0)
    loop.call_soon_threadsafe(lambda: None)
    outcomes = waiting.join(600)
    assert len(outcomes) == n
    assert all(isinstance(o, WaitTimeout) for o in outcomes), {type(o) for o in outcomes}
    assert {o.result.id for o in outcomes} == {r.id for r in results}
    assert "600" in str(outcomes[0]) and results[0].id in str(outcomes[0])
    assert watcher.waiting == 0
    for thread in registered.threads:  # the idle watcher ends, closing its connection
        thread.join(30)
        assert not thread.is_alive()
    assert watcher._thread is None
    if isinstance(watcher, finished.ListeningWatcher):
        assert not watcher.listening.is_set()
    # The few connections the async reads share, not one a waiter.
    assert _session_count() - before <= 6, (before, _session_count())
    assert TaskRecord.objects.filter(status=TaskResultStatus.READY).count() == n
    loop.close()


class JumpingLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock a test moves forward (``offset``, seconds)."""

    offset = 0.0

    def time(self) -> float:
        return super().time() + JumpingLoop.offset


@pytest.mark.django_db(transaction=True)
def test_a_killed_listening_connection_is_opened_again_and_the_wait_returns(
    worker_process: StartWorker,
    events: EventLog,
    gate: Gate,
    registered: Registered,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN is PostgreSQL's")
    monkeypatch.setattr(finished, "SAFETY_POLL", 600.0)  # only the reconnection can wake it
    result = tasks_wait.wait_at_then.enqueue(gate.path)
    worker_process("--concurrency", "1")
    events.wait("note", what="start")
    waiting = InThread(lambda: result.wait(timeout=60))
    registered.wait()
    watcher = watcher_of(backend())
    assert isinstance(watcher, finished.ListeningWatcher)
    assert watcher.listening.wait(30)
    killed = watcher.backend_pid
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [killed])
    gate.open()
    started = time.monotonic()
    assert waiting.join().status == TaskResultStatus.SUCCESSFUL
    assert time.monotonic() - started < 20
    assert watcher.backend_pid != killed


@pytest.mark.django_db(transaction=True)
def test_an_outcome_batch_announces_its_finished_tasks_in_notifications_under_8000_bytes() -> None:
    """450 outcomes in one statement: three NOTIFYs of at most 200 ids each, the finished
    ones only (a retried task is READY again, not finished)."""
    if connection.vendor != "postgresql":
        pytest.skip("NOTIFY is PostgreSQL's")
    import psycopg

    from django_sqltasks.sql import Outcome, dialect_for
    from django_sqltasks.sql.channels import FINISHED_CHANNEL
    from django_sqltasks.sql.pg import connection_params
    from tests.factories import task_row

    rows = [task_row(TaskResultStatus.RUNNING, owner="w").id for _ in range(451)]
    now = timezone.now()
    outcomes = [
        Outcome(id=i, status="SUCCESSFUL", finished_at=now, return_value="1") for i in rows[:450]
    ]
    outcomes.append(
        Outcome(id=rows[450], status="READY", finished_at=None, return_value=None, delay=60.0)
    )
    with psycopg.connect(**connection_params("default"), autocommit=True) as listener:
        listener.execute(f"LISTEN {FINISHED_CHANNEL}")
        with connection.cursor() as cursor:
            written = dialect_for(connection).complete(cursor, "w", outcomes)
        assert written == set(rows)
        payloads = [n.payload for n in listener.notifies(timeout=10, stop_after=3)]
    assert [len(p.split(",")) for p in payloads] == [200, 200, 50]
    assert all(len(p.encode()) < 8000 for p in payloads)
    assert {i for p in payloads for i in p.split(",")} == {str(i) for i in rows[:450]}


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_async_wait_leaves_its_watcher(registered: Registered) -> None:
    result = tasks.add.enqueue(1, 2)

    async def main() -> int:
        waiting = asyncio.ensure_future(result.await_result(timeout=60))
        await asyncio.to_thread(registered.wait)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return watcher_of(backend()).waiting

    assert InThread(lambda: asyncio.run(main())).join() == 0


@pytest.mark.django_db(transaction=True)
def test_an_idle_watcher_ends_its_thread_and_closes_its_connection(
    registered: Registered, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(finished, "IDLE_CLOSE", 0.05)
    result = tasks.add.enqueue(1, 2)
    with pytest.raises(WaitTimeout):
        result.wait(timeout=0.2)
    watcher = watcher_of(backend())
    (thread,) = registered.threads
    thread.join(10)
    assert not thread.is_alive()
    assert watcher._thread is None
    if isinstance(watcher, finished.ListeningWatcher):
        assert not watcher.listening.is_set()


@pytest.mark.django_db(transaction=True)
def test_a_rescue_that_gives_a_task_up_and_a_salvaged_outcome_announce_it() -> None:
    """The other two ways a worker's statements finish a task: a rescue that fails a task out
    of rescues, and an outcome stored as a failure because it could not be stored as it was.
    Their waiters are told at once, as for any outcome, not at the next sweep."""
    if connection.vendor != "postgresql":
        pytest.skip("NOTIFY is PostgreSQL's")
    import psycopg

    from django_sqltasks.sql import Outcome, dialect_for
    from django_sqltasks.sql.channels import FINISHED_CHANNEL
    from django_sqltasks.sql.pg import connection_params
    from tests.factories import task_row

    # Charged a rescue (it ran alone, as a suspect) and out of them; lost beside others: put
    # back, as a suspect.
    given_up = task_row(
        TaskResultStatus.RUNNING, owner="gone", limit_key="task:x", available_at=SUSPECT
    ).id
    rescued = task_row(TaskResultStatus.RUNNING, owner="gone").id
    salvaged = task_row(TaskResultStatus.RUNNING, owner="w").id
    outcome = Outcome(
        id=salvaged, status="SUCCESSFUL", finished_at=timezone.now(), return_value="1"
    )
    dialect = dialect_for(connection)
    with psycopg.connect(**connection_params("default"), autocommit=True) as listener:
        listener.execute(f"LISTEN {FINISHED_CHANNEL}")
        with connection.cursor() as cursor:
            assert dialect.salvage(cursor, "w", outcome, "it could not be stored") == {salvaged}
            count = dialect.requeue_orphans(
                cursor, backend_name="default", lease_timeout=5, max_rescues=0
            )
            assert count == 2  # as many as it put back or failed, as before
        payloads = [n.payload for n in listener.notifies(timeout=10, stop_after=2)]
    assert payloads == [str(salvaged), str(given_up)]
    statuses = dict(TaskRecord.objects.values_list("id", "status"))
    assert statuses == {given_up: "FAILED", rescued: "READY", salvaged: "FAILED"}


@pytest.mark.django_db(transaction=True)
def test_a_workflow_step_skipped_after_a_failure_announces_it(run_worker: Any) -> None:
    """A step that will never run fails when the step before it fails; its waiters are told
    by a notification of its own, as for a task that ran."""
    if connection.vendor != "postgresql":
        pytest.skip("NOTIFY is PostgreSQL's")
    import psycopg

    from django_sqltasks import group
    from django_sqltasks.sql.channels import FINISHED_CHANNEL
    from django_sqltasks.sql.pg import connection_params
    from tests import tasks_workflows as wf

    workflow = group(wf.add.s(1, 1), wf.boom.s()).then(wf.total.s()).enqueue()
    callback = str(workflow.members[-1].id)
    with psycopg.connect(**connection_params("default"), autocommit=True) as listener:
        listener.execute(f"LISTEN {FINISHED_CHANNEL}")
        run_worker()
        told: list[str] = []
        for notification in listener.notifies(timeout=10):
            told += notification.payload.split(",")
            if callback in told:
                break
    assert callback in told
    assert TaskRecord.objects.get(pk=callback).status == "FAILED"


@pytest.fixture
def kill_other_sessions() -> Iterator[Callable[[int | None], int]]:
    """``_kill_other_sessions``; afterwards, drop the connection it killed on the thread of
    Django's async ORM (a process-wide thread: the tests after this one would meet it dead)."""

    def drop_all() -> None:
        for each in connections.all(initialized_only=True):
            drop(each)

    yield _kill_other_sessions
    _on_async_thread(drop_all)


def _kill_other_sessions(spare: int | None) -> int:
    """Kill every session of the test database but this thread's and ``spare`` (a real
    connection dropped, as by a restart or a failover); return how many were killed."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                "current_database() AND pid <> pg_backend_pid() AND pid <> %s",
                [spare or 0],
            )
            return sum(1 for (killed,) in cursor.fetchall() if killed)
        cursor.execute(
            "SELECT id FROM information_schema.processlist WHERE db = DATABASE() "
            "AND id <> CONNECTION_ID() AND id <> %s",
            [spare or 0],
        )
        killed = 0
        for (session,) in cursor.fetchall():
            try:
                cursor.execute(f"KILL {int(session)}")
            except OperationalError as error:
                if error.args[0] != UNKNOWN_THREAD:
                    raise
                continue  # it ended between the list and the kill (another test's, closing)
            killed += 1
        return killed


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("how", "when"), [("sync", "waiting"), ("sync", "before"), ("async", "waiting")]
)
def test_a_wait_outlasts_its_connection_being_killed(
    how: str, when: str, registered: Registered, kill_other_sessions: Callable[[int | None], int]
) -> None:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no connection to lose: a file")
    result = tasks.add.enqueue(1, 2)
    connected, go = threading.Event(), threading.Event()

    def wait() -> Any:
        if when == "before":
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT 1")  # connected: the kill drops this connection
            connected.set()
            assert go.wait(30)
        return result.wait(timeout=60)

    async def await_() -> Any:
        return await result.await_result(timeout=60)

    waiting = InThread(wait if how == "sync" else lambda: asyncio.run(await_()))
    if when == "before":
        assert connected.wait(30)
    else:
        registered.wait()  # the wait read its row: its connection is open
    watcher = watcher_of(backend())
    spare = watcher.backend_pid if isinstance(watcher, finished.ListeningWatcher) else None
    assert kill_other_sessions(spare) >= 1
    assert backend().cancel(result.id)  # the task ends while the waiter's connection is gone
    go.set()
    assert waiting.join().status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == CANCELLED


class Outage:
    """A TCP relay to the database server, for the connections opened while the test points
    its database settings at it: ``down(n)`` breaks the connections it relays and turns the
    next ``n`` away (closed before the server's greeting, as from a server that is restarting,
    or a proxy with no server behind it), then it relays again."""

    def __init__(self, host: str, port: int) -> None:
        self._server = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._to_refuse = 0
        self.turned_away = 0
        self._open: list[socket.socket] = []  # relayed now
        self._sockets: list[socket.socket] = []  # every one relayed, closed at the end
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def down(self, refusals: int) -> None:
        with self._lock:
            self._to_refuse = refusals
            for each in self._open:
                with contextlib.suppress(OSError):
                    each.shutdown(socket.SHUT_RDWR)
            self._open.clear()

    def close(self) -> None:
        self.down(0)
        self._listener.close()
        for each in self._sockets:
            each.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._to_refuse:
                    self._to_refuse -= 1
                    self.turned_away += 1
                    client.close()
                    continue
                server = socket.create_connection(self._server)
                self._open += [client, server]
                self._sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for each in (source, sink):
            with contextlib.suppress(OSError):
                each.shutdown(socket.SHUT_RDWR)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_wait_outlasts_an_outage_of_its_database(how: str) -> None:
    """The server goes away while a wait's connection is open, and turns the next
    connections away: the wait tries again, backing off, until the server is back and reads
    its task's end (a wait raised OperationalError during an outage, though its task ended)."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no server to lose: a file")
    result = tasks.add.enqueue(1, 2)
    settings = connection.settings_dict  # shared by every thread's connection
    outage = Outage(settings["HOST"] or "127.0.0.1", int(settings["PORT"]))
    connected, go = threading.Event(), threading.Event()

    def connect() -> None:
        drop(connections["default"])  # a thread's connection, opened again through the relay
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")

    def wait() -> Any:
        connect()
        if how == "async":
            _on_async_thread(connect)  # the async ORM's thread (PostgreSQL reads on the loop)
        connected.set()
        assert go.wait(30)
        if how == "async":
            return asyncio.run(result.await_result(timeout=60))
        return result.wait(timeout=60)

    direct = (settings["HOST"], settings["PORT"])
    settings["HOST"], settings["PORT"] = "127.0.0.1", outage.port  # this thread stays connected
    try:
        waiting = InThread(wait)
        assert connected.wait(30)
        outage.down(refusals=4)
        assert backend().cancel(result.id)  # the task ends during the outage
        go.set()
        assert waiting.join().status == TaskResultStatus.FAILED
    finally:
        settings["HOST"], settings["PORT"] = direct
        outage.close()
        # The async ORM's thread lives as long as the process: no relayed connection stays.
        _on_async_thread(lambda: drop(connections["default"]))
    assert outage.turned_away == 4  # the wait tried each time, and then read its task
    assert result.errors[-1].exception_class_path == CANCELLED


def _on_async_thread(call: Callable[[], Any]) -> Any:
    """Run ``call`` on the thread ``sync_to_async`` hops to outside a request (one per process,
    and its Django connection lives as long as the process)."""

    async def hop() -> Any:
        return await sync_to_async(call)()

    return asyncio.run(hop())


@pytest.mark.django_db(transaction=True)
def test_a_connection_killed_while_idle_costs_no_later_wait_or_aenqueue(
    kill_other_sessions: Callable[[int | None], int],
) -> None:
    """The connection of ``sync_to_async``'s thread is killed between two calls (a failover,
    an idle timeout): a wait with no time left still reads its finished task, and after one
    failed enqueue at most, aenqueue writes again; nothing is left failing on that thread."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no connection to lose: a file")
    done = tasks.add.enqueue(1, 2)
    TaskRecord.objects.filter(id=done.id).update(status=TaskResultStatus.SUCCESSFUL)

    def connect() -> int:
        drop(connections["default"])  # killed by the round before, where nothing used it
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")
            return 1

    for check in range(2):
        _on_async_thread(connect)  # that thread holds an open connection
        assert kill_other_sessions(None) >= 1
        if check == 0:
            assert asyncio.run(done.await_result(timeout=0)).status == TaskResultStatus.SUCCESSFUL
            continue
        # Its statement may meet the dead connection and raise, as a sync enqueue() would.
        with contextlib.suppress(DatabaseError):
            asyncio.run(tasks.noop.aenqueue())
        written = asyncio.run(tasks.noop.aenqueue())
        assert TaskRecord.objects.filter(id=written.id).exists()
        batch = asyncio.run(_gather(lambda: tasks.noop.aenqueue(), 5))
        assert TaskRecord.objects.filter(id__in=[r.id for r in batch]).count() == 5


async def _gather(make: Callable[[], Any], count: int) -> list[Any]:
    return list(await asyncio.gather(*(make() for _ in range(count))))
