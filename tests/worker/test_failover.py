"""The gauntlet, a failover: a primary and its streaming standby, workers and an enqueuer given
both (libpq's host list with ``target_session_attrs=read-write``), the standby promoted and the
primary killed under load. The workers are back on the new primary within seconds; every task
it holds ends, none left RUNNING; a task runs at most once more than it would have. With a
synchronous standby nothing the enqueuer saw committed is lost; with an asynchronous one that
fell behind, what is lost is the old primary's last commits (docs/operations.md, "Failover")."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection

from django_sqltasks.models import TaskRecord
from tests import conftest, gauntlet_tasks
from tests.conftest import ROOT, WorkerProcess, worker_env
from tests.events import ENV as EVENTS_ENV
from tests.events import EventLog, Gate
from tests.gauntlet_postgres import PrivatePostgres, find_bindir

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker_process,
    pytest.mark.failover,
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="runs in the PostgreSQL leg of the suite"
    ),
]

StartWorker = Callable[..., WorkerProcess]
TABLE = TaskRecord._meta.db_table
BACK_WITHIN = 10.0  # seconds from the switch to each worker's first task on the new primary
WORKERS = 2
CONCURRENCY = 4
TASK_SECONDS = 0.02  # each task holds its slot this long: tasks are in flight at the switch
BEFORE = 200  # tasks enqueued before the workers start
MORE = 60  # enqueues committed at each stage of the run (before the cut, after the switch)


@dataclass(frozen=True)
class Pair:
    """A primary and its streaming standby."""

    primary: PrivatePostgres
    standby: PrivatePostgres

    def env(self) -> dict[str, str]:
        """A worker's or the enqueuer's environment: both servers, a short lease."""
        return {
            "DATABASE_URL": self.primary.url,
            "SQLTASKS_TEST_DB_NAME": self.primary.database,
            "SQLTASKS_TEST_FAILOVER_PORTS": f"{self.primary.port},{self.standby.port}",
            "SQLTASKS_LEASE_TIMEOUT": "10",
            "SQLTASKS_HEARTBEAT_INTERVAL": "1",
        }


@contextlib.contextmanager
def streaming_pair(mode: str) -> Iterator[Pair]:
    """A primary and a standby streaming from it: ``mode`` "sync" (the primary's commits wait
    for the standby to have them) or "async"."""
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    primary = PrivatePostgres(bindir).init()
    standby = None
    try:
        # The new primary has no standby of its own: it must not wait for one.
        standby = primary.standby({"synchronous_standby_names": ""})
        if mode == "sync":
            primary.reconfigure("synchronous_standby_names", "*")
        wait_for_streaming(primary, mode)
        yield Pair(primary, standby)
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


@pytest.fixture(params=["sync", "async", "switchover"])
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    """A pair for each way to change primaries: a failover with a synchronous standby or an
    asynchronous one, and a planned switchover (to a synchronous standby)."""
    with streaming_pair("async" if request.param == "async" else "sync") as both:
        yield both


@pytest.fixture
def async_pair() -> Iterator[Pair]:
    with streaming_pair("async") as both:
        yield both


def fall_behind(pair: Pair) -> None:
    """Cut the standby off: it stops receiving, and the primary goes on without it
    (asynchronous: its commits do not wait). What the primary commits from now on is lost at
    a failover."""
    pair.standby.reconfigure("primary_conninfo", "")
    wait_for_streaming(pair.primary, None)


def switch_over(pair: Pair) -> float:
    """Fence the primary (every transaction read-only from now on, its sessions' included; it
    stays up), wait until the standby has all it wrote, and promote the standby; the time
    (monotonic) of the fence."""
    pair.primary.reconfigure("default_transaction_read_only", "on")
    fenced = time.monotonic()
    (last,) = pair.primary.query("SELECT pg_current_wal_lsn()::text")[0]
    caught_up = f"SELECT pg_last_wal_replay_lsn() >= '{last}'::pg_lsn"
    while pair.standby.query(caught_up) != [(True,)]:
        assert time.monotonic() < fenced + 60, "the standby did not catch up"
        time.sleep(0.05)  # a server's own state: no event tells it
    pair.standby.promote()
    return fenced


def fail_over(pair: Pair) -> float:
    """Promote the standby, then kill the primary; the time (monotonic) of the kill."""
    pair.standby.promote()
    pair.primary.kill()
    return time.monotonic()


def migrate(env: dict[str, str], code: str = "") -> None:
    run_python(
        "from django.core.management import call_command\n"
        f"call_command('migrate', verbosity=0)\n{code}",
        env,
    )


def wait_for_streaming(primary: PrivatePostgres, state: str | None) -> None:
    """Wait until the primary streams to its standby, ``state`` (its ``sync_state``: "sync",
    "async"), or (None) to none."""
    deadline = time.monotonic() + 60
    sql = "SELECT sync_state FROM pg_stat_replication"
    expected = [] if state is None else [(state,)]
    while primary.query(sql) != expected:
        assert time.monotonic() < deadline, f"replication is not {state or 'off'}"
        time.sleep(0.1)  # a server's own state: no event tells it


def run_python(code: str, env: dict[str, str]) -> None:
    done = conftest.run_python(code, **env)
    assert done.returncode == 0, done.stderr


@dataclass(frozen=True)
class Ack:
    """One line of the enqueuer's: a task it saw committed (``port``: on which server), or an
    enqueue that raised (``port`` None, ``id`` None: committed or not, it cannot tell)."""

    label: str
    id: str | None
    port: int | None


def read_acks(path: Path) -> list[Ack]:
    acks = []
    for line in path.read_text().splitlines() if path.exists() else []:
        kind, label, *rest = line.split()
        if kind == "ok":
            acks.append(Ack(label, rest[0], int(rest[1])))
        else:
            acks.append(Ack(label, None, None))
    return acks


def test_failover_under_load(
    pair: Pair,
    worker_process: StartWorker,
    events: EventLog,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    mode = request.node.callspec.params["pair"]
    primary, standby = pair.primary, pair.standby
    env = pair.env()
    log, acked, stop = tmp_path / "executions", tmp_path / "acked", tmp_path / "stop"
    errors = tmp_path / "enqueuer.err"
    migrate(
        env,
        "from tests import gauntlet_tasks as g\n"
        f"calls = [(({str(log)!r}, f'b{{i}}', {TASK_SECONDS}), {{}}) for i in range({BEFORE})]\n"
        "g.mark_slowly.get_backend().enqueue_many(g.mark_slowly, calls)\n",
    )
    workers = [
        worker_process("--concurrency", str(CONCURRENCY), "--worker-id", f"w{n}", env=env)
        for n in range(WORKERS)
    ]
    with errors.open("w") as stderr:
        enqueuer = subprocess.Popen(
            [
                sys.executable, "-c",
                "import django; django.setup()\nfrom tests import gauntlet_tasks as g\n"
                f"g.enqueue_steadily({str(log)!r}, {str(acked)!r}, {str(stop)!r}, {TASK_SECONDS})",
            ],
            cwd=ROOT, env=worker_env(**env, **{EVENTS_ENV: events.path}),
            stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    try:
        events.wait("task_finished", count=BEFORE, timeout=120)
        events.until(lambda: len(read_acks(acked)) >= MORE, f"{MORE} steady enqueues")
        if mode == "async":
            fall_behind(pair)
            cut = len(read_acks(acked))
            events.until(lambda: len(read_acks(acked)) >= cut + MORE, "enqueues after the cut")
        switched = switch_over(pair) if mode == "switchover" else fail_over(pair)
        seen = events.mark()

        def on_new_primary() -> list[Ack]:
            return [a for a in read_acks(acked) if a.port == standby.port]

        events.until(lambda: len(on_new_primary()) >= MORE, "enqueues on the new primary")
        stop.touch()
        assert enqueuer.wait(timeout=60) == 0, errors.read_text()

        # Each worker is back: it ran a task that only the new primary ever held.
        new_ids = {a.id for a in on_new_primary()}
        back: dict[int, float] = {}
        for event in events.all("task_finished", after=seen):
            if event["id"] in new_ids:
                back.setdefault(event.pid, event.at - switched)
        assert len(back) == WORKERS, f"workers back on the new primary: {back}"
        assert max(back.values()) < BACK_WITHIN, back

        # Every task the new primary holds ends: none is left READY or RUNNING.
        def open_tasks() -> list[tuple[str, int]]:
            sql = f"SELECT status, count(*) FROM {TABLE} WHERE status <> 'SUCCESSFUL' GROUP BY 1"
            return standby.query(sql)

        events.until(lambda: not open_tasks(), "every task ended on the new primary", timeout=90)
        ended = time.monotonic() - switched
    finally:
        stop.touch()
        if enqueuer.poll() is None:
            enqueuer.kill()
            enqueuer.wait()
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=60) == 0, worker.output

    held = {label for (label,) in standby.query(f"SELECT args->>1 FROM {TABLE}")}
    runs = Counter(gauntlet_tasks.executions(log))
    assert held <= set(runs), f"never ran: {sorted(held - set(runs))[:10]}"
    again = sorted(label for label, n in runs.items() if n > 1)
    assert max(runs.values()) <= 2, f"ran more than once more: {runs.most_common(3)}"

    acks = read_acks(acked)
    committed = [a for a in acks if a.id is not None]
    lost = [a for a in committed if a.label not in held]
    assert all(a.port == primary.port for a in lost), "lost what the new primary took"
    if mode != "async":
        assert lost == [], f"lost what was committed: {lost[:5]}"
    else:
        # The standby has a prefix of the old primary's commits: what it lacks of those the
        # enqueuer saw committed there is their tail, the last ones before the switch.
        on_old = [a for a in committed if a.port == primary.port]
        assert lost, "the standby that fell behind lost nothing: the test did not cut it off"
        assert on_old[-len(lost) :] == lost, "lost an enqueue older than one that was kept"
    uncertain = [a.label for a in acks if a.id is None]
    outputs = "".join(w.output for w in workers)
    print(
        f"\n{mode}: back after {', '.join(f'{s:.1f}s' for s in sorted(back.values()))}; "
        f"all ended {ended:.1f}s after the switch; {len(committed)} enqueues committed, "
        f"{len(lost)} of them lost, {len(uncertain)} raised "
        f"({sum(label in held for label in uncertain)} of those stored); "
        f"{len(again)} tasks ran twice; "
        f"{outputs.count('Transient database error')} transient errors logged"
    )


def enqueue_at_gate(env: dict[str, str], log: Path, gate: Gate, labels: str) -> None:
    """Enqueue ``mark_at_gate`` tasks, one for each of ``labels``, from a process of their own."""
    run_python(
        "from tests import gauntlet_tasks as g\n"
        f"for label in {labels!r}: g.mark_at_gate.enqueue({str(log)!r}, label, {gate.path!r})\n",
        env,
    )


def count_on(server: PrivatePostgres, status: str) -> int:
    return server.query(f"SELECT count(*) FROM {TABLE} WHERE status = '{status}'")[0][0]


def end_after_the_standby_fell_behind(
    pair: Pair, worker_process: StartWorker, events: EventLog, gate: Gate, log: Path
) -> dict[str, str]:
    """Start a worker (two slots; it listens, and polls seldom) with tasks "a" and "b" RUNNING
    for it on both servers; cut the standby off, then let them end: their outcomes are on the
    primary only. Return the worker's environment."""
    env = {**pair.env(), "SQLTASKS_POLL_INTERVAL": "30"}
    migrate(env)
    enqueue_at_gate(env, log, gate, "ab")
    worker_process("--concurrency", "2", "--worker-id", "w", env=env)
    events.wait("note", count=2, what="at_gate")
    events.until(lambda: count_on(pair.standby, "RUNNING") == 2, "the claims on the standby")
    fall_behind(pair)
    gate.open()
    events.wait("task_finished", count=2)
    return env


def test_an_idle_worker_runs_again_what_the_failover_lost(
    async_pair: Pair, worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    """Tasks claimed while the standby still streamed, and ended after it fell behind: the new
    primary has them RUNNING for a worker that is alive and heartbeating there, but holds them
    no more, so their lease never runs out. The worker, waiting for a notification when its
    connections die, claims at once on the new primary, puts them back first, and they run
    again."""
    log = tmp_path / "executions"
    end_after_the_standby_fell_behind(async_pair, worker_process, events, gate, log)
    switched = fail_over(async_pair)
    events.until(
        lambda: count_on(async_pair.standby, "SUCCESSFUL") == 2,
        "the tasks to end on the new primary",
        timeout=60,
    )
    ended = time.monotonic() - switched
    assert ended < BACK_WITHIN, f"ended again {ended:.1f}s after the switch"
    assert Counter(gauntlet_tasks.executions(log)) == {"a": 2, "b": 2}
    print(f"\nended again {ended:.1f}s after the switch")


def test_a_busy_worker_runs_again_what_the_failover_lost(
    async_pair: Pair, worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    """As above, but the worker's slots are full at the switch ("c" and "d", enqueued after
    the standby fell behind: lost with the old primary), so it claims nothing until they end;
    by then its heartbeat has reconnected its database thread, and its next claim opens a new
    connection: no claim fails. It puts "a" and "b" back all the same, because a connection
    of it was lost."""
    log = tmp_path / "executions"
    env = end_after_the_standby_fell_behind(async_pair, worker_process, events, gate, log)
    second = Gate(str(tmp_path / "second"))
    try:
        enqueue_at_gate(env, log, second, "cd")
        events.wait("note", count=4, what="at_gate")
        fail_over(async_pair)
        # The heartbeat's rescue pass on the new primary: the database thread is back.
        events.until(lambda: count_on(async_pair.standby, "RUNNING") == 2, "the new primary")
        events.wait("rescue_pass", after=events.mark(), count=2)
        second.open()
        opened = time.monotonic()
        events.until(
            lambda: count_on(async_pair.standby, "SUCCESSFUL") == 2,
            "the tasks to end on the new primary",
            timeout=60,
        )
    finally:
        second.close()
    ended = time.monotonic() - opened
    assert ended < BACK_WITHIN, f"ended again {ended:.1f}s after the slots freed"
    assert Counter(gauntlet_tasks.executions(log)) == {"a": 2, "b": 2, "c": 1, "d": 1}
    print(f"\nended again {ended:.1f}s after the slots freed")
