"""Concurrency and rate limits: enforced in the claim, shared by every worker, free to leave
unused; on every database."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from django_sqltasks.compat import InvalidTask, TaskResultStatus, task
from django_sqltasks.core.limits import Limit, parse_rate
from django_sqltasks.core.options import BackendOptions, OptionError
from django_sqltasks.models import TaskLimit, TaskRecord
from django_sqltasks.sql import ClaimedRow, dialect_for
from django_sqltasks.worker.limited import LimitedClaim
from tests import tasks_limits
from tests.conftest import WorkerProcess, expire_lease
from tests.events import EventLog, Gate
from tests.tasks_limits import intervals, most_at_once

pytestmark = pytest.mark.django_db


def limited_claim(
    worker_id: str = "w1", queue_limits: dict[str, Limit] | None = None
) -> LimitedClaim:
    return LimitedClaim(
        backend_name="default",
        database="default",
        worker_id=worker_id,
        queue_names=None,
        queue_limits=queue_limits or {},
    )


def claim(limited: LimitedClaim, room: int = 100) -> list[ClaimedRow]:
    with connection.cursor() as cursor:
        limited.scan(dialect_for(connection), cursor, force=True)
        return limited.claim(dialect_for(connection), cursor, room)


def main_claim(room: int = 100, exclude: tuple[str, ...] = ()) -> list[ClaimedRow]:
    from django_sqltasks.sql import Scope

    with connection.cursor() as cursor:
        return dialect_for(connection).claim(
            cursor,
            backend_name="default",
            queue_names=None,
            worker_id="main",
            limit=room,
            scope=Scope(exclude_queues=exclude),
        )


def finish(rows: list[ClaimedRow]) -> None:
    TaskRecord.objects.filter(id__in=[r.id for r in rows]).update(
        status=TaskResultStatus.SUCCESSFUL, owner=None, finished_at=timezone.now()
    )


def make_due() -> None:
    """Move every READY row a minute back: due by any database's clock."""
    TaskRecord.objects.filter(status="READY").update(
        available_at=timezone.now() - timedelta(minutes=1)
    )


# Options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency_limit": 0}, "concurrency_limit must be a whole number of at least 1"),
        ({"concurrency_limit": True}, "concurrency_limit must be a whole number"),
        ({"concurrency_limit": 2.5}, "concurrency_limit must be a whole number"),
        ({"rate_limit": "5"}, "rate_limit must be a string like '10/s'"),
        ({"rate_limit": "5/d"}, "rate_limit must be a string like '10/s'"),
        ({"rate_limit": 5}, "rate_limit must be a string like '10/s'"),
        ({"rate_limit": "0/s"}, "rate_limit must allow 1 to 10,000 starts a period"),
        ({"concurrency_key": str}, "concurrency_key needs concurrency_limit"),
        ({"concurrency_limit": 1, "concurrency_key": "x"}, "concurrency_key must be a callable"),
    ],
)
def test_bad_limit_options_are_refused_naming_the_option(
    options: dict[str, object], message: str
) -> None:
    def decorate_and_enqueue() -> None:
        task(**options)(tasks_limits.undecorated).enqueue()

    with pytest.raises(InvalidTask, match=re.escape(message)):
        decorate_and_enqueue()


def test_rates_read_per_second_minute_and_hour() -> None:
    assert parse_rate("10/s", "r") == (10, 1.0)
    assert parse_rate(" 100 / m ", "r") == (100, 60.0)
    assert parse_rate("1000/h", "r") == (1000, 3600.0)


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ("x", "QUEUE_LIMITS'] must be a dict"),
        ({"q": 5}, "QUEUE_LIMITS']['q'] must be a dict like"),
        ({"q": {}}, "sets no limit"),
        ({"q": {"concurrency": 0}}, "['concurrency'] must be a whole number of at least 1"),
        ({"q": {"rate": "1/week"}}, "['rate'] must be a string like"),
        ({"q": {"burst": 3}}, "unknown keys ['burst']"),
    ],
)
def test_bad_queue_limits_are_refused_naming_the_entry(limits: object, message: str) -> None:
    with pytest.raises(OptionError) as raised:
        BackendOptions.parse("default", {"QUEUE_LIMITS": limits})
    assert message in str(raised.value)
    assert "TASKS['default']['OPTIONS']['QUEUE_LIMITS']" in str(raised.value)


# Keys -------------------------------------------------------------------------------------


def test_enqueue_stores_the_limit_key(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    results = [
        tasks_limits.two_at_once.enqueue(log, "a"),
        tasks_limits.one_per_customer.enqueue(log, "acme", "b"),
        tasks_limits.three_a_second.enqueue(log, "c"),
        tasks_limits.unlimited.enqueue(log, "d"),
    ]
    keys = {str(k): v for k, v in TaskRecord.objects.values_list("id", "limit_key")}
    assert [keys[r.id] for r in results] == [
        "task:tests.tasks_limits.two_at_once",
        "task:tests.tasks_limits.one_per_customer#acme",
        "task:tests.tasks_limits.three_a_second",
        None,
    ]


def test_a_long_or_bad_concurrency_key_is_hashed_or_refused(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    result = tasks_limits.one_per_customer.enqueue(log, "x" * 1000, "a")
    key = TaskRecord.objects.get(id=result.id).limit_key
    assert key is not None and len(key) <= 255 and "#sha256:" in key
    with pytest.raises(InvalidTask, match="must return a non-empty str"):
        tasks_limits.one_per_customer.enqueue(log, "", "a")
    with pytest.raises(InvalidTask, match="must return a non-empty str, not 5"):
        tasks_limits.one_per_customer.enqueue(log, 5, "a")
    assert TaskRecord.objects.count() == 1


# The claim --------------------------------------------------------------------------------


def test_the_main_claim_leaves_limited_tasks_and_takes_those_behind_them(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    limited = [tasks_limits.two_at_once.using(priority=10).enqueue(log, f"l{i}") for i in range(5)]
    free = [tasks_limits.unlimited.enqueue(log, f"u{i}") for i in range(3)]
    make_due()
    rows = main_claim()
    assert {str(r.id) for r in rows} == {r.id for r in free}
    got = claim(limited_claim())
    assert len(got) == 2
    assert {str(r.id) for r in got} <= {r.id for r in limited}


def test_a_concurrency_limit_counts_running_tasks_of_every_worker(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    for i in range(5):
        tasks_limits.two_at_once.enqueue(log, f"l{i}")
    make_due()
    first = claim(limited_claim("w1"))
    assert len(first) == 2
    assert claim(limited_claim("w2")) == []  # another worker: the limit is full
    finish(first[:1])
    second = claim(limited_claim("w2"))
    assert len(second) == 1
    # A task rescued from a dead worker is READY again: its slot is free without bookkeeping.
    TaskRecord.objects.filter(id=second[0].id).update(status="READY", owner=None)
    assert len(claim(limited_claim("w3"))) == 1
    limit = TaskLimit.objects.get(key="task:tests.tasks_limits.two_at_once")
    assert limit.concurrency == 2


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL's claim marks")
@pytest.mark.django_db(transaction=True)  # the marks follow the database's snapshots
def test_a_limit_keys_claims_go_on_from_where_they_took(tmp_path: Path) -> None:
    """Each limited group's claim reads its key's due tasks from its marks (sql/marks.py),
    kept per group: the second claim of one worker goes on past what the first took."""
    log = str(tmp_path / "log")
    for i in range(4):
        tasks_limits.two_at_once.enqueue(log, f"l{i}")
    make_due()
    limited = limited_claim("w1")
    first = claim(limited)
    assert len(first) == 2
    (marks,) = limited._marks.values()
    assert set(marks.marks) == {0} and marks.full_passes == 1
    finish(first)
    second = claim(limited)
    assert len(second) == 2 and {r.id for r in second}.isdisjoint(r.id for r in first)
    assert list(limited._marks.values()) == [marks]  # the same group's marks


def test_a_concurrency_key_limits_each_key_apart(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    for customer in ("acme", "acme", "globex", "globex", "initech"):
        tasks_limits.one_per_customer.enqueue(log, customer, "x")
    make_due()
    got = claim(limited_claim())
    assert sorted(r.kwargs.get("customer") or r.args[1] for r in got) == [
        "acme",
        "globex",
        "initech",
    ]
    assert claim(limited_claim()) == []


@pytest.mark.django_db(transaction=True)  # PostgreSQL's now() is the transaction's start
def test_a_rate_limit_counts_starts_in_a_sliding_window(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    for i in range(7):
        tasks_limits.three_a_second.enqueue(log, f"r{i}")
    make_due()
    worker = limited_claim()
    first = claim(worker)
    assert len(first) == 3
    finish(first)  # finished or not, starts count against a rate
    assert claim(worker) == []
    # Time as data: the window's starts (database-clock seconds) are dated back, as time would.
    date_rate_starts(0.5)
    assert claim(worker) == []  # half a second on, still in the window
    date_rate_starts(1.1)
    assert len(claim(worker)) == 3


def date_rate_starts(seconds_ago: float) -> None:
    """Date every recorded start of every rate limit ``seconds_ago`` before the database's
    clock, however long the test took to come here (moving them back from when they were
    recorded let a loaded machine's own delay push them out of the window)."""
    with connection.cursor() as cursor:
        now = dialect_for(connection).db_now(cursor).timestamp()
    for limit in TaskLimit.objects.filter(rate__isnull=False):
        limit.starts = [now - seconds_ago for _ in limit.starts]
        limit.save(update_fields=["starts"])


def test_a_task_with_both_limits_obeys_the_tighter(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    for i in range(3):
        tasks_limits.one_and_hundred_an_hour.enqueue(log, f"b{i}")
    make_due()
    got = claim(limited_claim())
    assert len(got) == 1
    finish(got)
    assert len(claim(limited_claim())) == 1
    limit = TaskLimit.objects.get(key="task:tests.tasks_limits.one_and_hundred_an_hour")
    assert (limit.concurrency, limit.rate, limit.period, len(limit.starts)) == (1, 100, 3600, 2)


def test_a_queue_limit_holds_its_queue_and_not_the_others(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    capped = [tasks_limits.in_other_queue.enqueue(log, f"q{i}") for i in range(4)]
    free = [tasks_limits.unlimited.enqueue(log, f"u{i}") for i in range(2)]
    make_due()
    worker = limited_claim(queue_limits={"other": Limit(concurrency=2)})
    assert {str(r.id) for r in main_claim(exclude=worker.excluded)} == {r.id for r in free}
    got = claim(worker)
    assert len(got) == 2 and {str(r.id) for r in got} <= {r.id for r in capped}
    assert claim(worker) == []


def test_a_limited_task_in_a_limited_queue_obeys_both(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    for i in range(4):
        tasks_limits.two_at_once.using(queue_name="other").enqueue(log, f"l{i}")
    make_due()
    worker = limited_claim(queue_limits={"other": Limit(concurrency=1)})
    assert len(claim(worker)) == 1
    assert claim(worker) == []


def test_nothing_is_scanned_for_or_locked_when_no_limit_is_used(tmp_path: Path) -> None:
    tasks_limits.unlimited.enqueue(str(tmp_path / "log"), "u")
    worker = limited_claim()
    with connection.cursor() as cursor:
        worker.scan(dialect_for(connection), cursor, force=True)
    assert not worker.active
    assert not TaskLimit.objects.exists()


# Worker processes -------------------------------------------------------------------------


@pytest.mark.worker_process_core
@pytest.mark.django_db(transaction=True)
@pytest.mark.worker_process
def test_four_worker_processes_never_overshoot_a_concurrency_limit(
    worker_process: Callable[..., WorkerProcess], events: EventLog, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    count = 24
    for i in range(count):
        tasks_limits.two_at_once.enqueue(str(log), f"t{i}", 0.1)
    for i in range(12):
        tasks_limits.one_per_customer.enqueue(str(log), f"c{i % 3}", f"k{i}", 0.1)
    workers = [worker_process("--concurrency", "4", "--burst") for _ in range(4)]
    events.wait("task_finished", count=count + 12, timeout=120)
    for worker in workers:
        worker.stop()
    spans = intervals(log)
    plain = [s for s in spans if s[2].startswith("t")]
    assert len({s[2] for s in plain}) == count, "a task ran twice or not at all"
    assert most_at_once(plain) <= 2, "the concurrency limit was overshot"
    for customer in ("c0", "c1", "c2"):
        assert most_at_once([s for s in spans if s[2].startswith(customer + ":")]) == 1
    # Other keys ran side by side: the limit is per key.
    assert most_at_once([s for s in spans if ":" in s[2]]) > 1
    assert TaskRecord.objects.exclude(status="SUCCESSFUL").count() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker_process
def test_worker_processes_share_a_queue_limit(
    worker_process: Callable[..., WorkerProcess], events: EventLog, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    for i in range(12):
        tasks_limits.in_other_queue.enqueue(str(log), f"q{i}", 0.1)
    for i in range(20):
        tasks_limits.unlimited.enqueue(str(log), f"u{i}")
    env = {"SQLTASKS_QUEUE_LIMITS": json.dumps({"other": {"concurrency": 2}})}
    workers = [worker_process("--concurrency", "4", "--queue", "*", env=env) for _ in range(3)]
    events.wait("task_finished", count=32, timeout=120)
    for worker in workers:
        worker.stop()
    spans = intervals(log)
    assert most_at_once([s for s in spans if s[2].startswith("q")]) <= 2
    assert TaskRecord.objects.exclude(status="SUCCESSFUL").count() == 0


# What operators see -----------------------------------------------------------------------


def test_overview_metrics_and_admin_show_limited_and_paused(tmp_path: Path) -> None:
    from io import StringIO

    from django.core.management import call_command

    from django_sqltasks.compat import task_backends
    from django_sqltasks.ops import overview
    from tests.factories import superuser_client

    log = str(tmp_path / "log")
    for i in range(3):
        tasks_limits.two_at_once.enqueue(log, f"l{i}")
    tasks_limits.unlimited.enqueue(log, "u")
    make_due()
    task_backends["default"].pause_queue("slow")
    claim(limited_claim())
    snapshot = overview.take()
    default = next(q for q in snapshot.queues if q.queue == "default")
    slow = next(q for q in snapshot.queues if q.queue == "slow")
    assert (default.due, default.limited, default.running, slow.paused) == (2, 1, 2, True)
    out = StringIO()
    call_command("tasks_status", "--plain", stdout=out)
    rows = {r.split()[1]: r.split() for r in out.getvalue().splitlines() if "default " in r}
    assert rows["slow"][-2:] == ["PAUSED", "0"] and rows["default"][-1] == "1"
    page = superuser_client().get("/admin/django_sqltasks/tasklimit/")
    assert page.status_code == 200
    assert b"task:tests.tasks_limits.two_at_once" in page.content


def test_metrics_expose_paused_queues_and_limited_tasks(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    from django_sqltasks.compat import task_backends
    from django_sqltasks.ops.metrics import QueueCollector

    tasks_limits.two_at_once.enqueue(str(tmp_path / "log"), "l")
    make_due()
    task_backends["default"].pause_queue("slow")
    registry = CollectorRegistry()
    registry.register(QueueCollector("default"))
    text = generate_latest(registry).decode()
    assert 'sqltasks_queue_depth{backend="default",queue="default",state="limited"} 1.0' in text
    assert 'sqltasks_queue_paused{backend="default",queue="slow"} 1.0' in text


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker_process
def test_a_busy_worker_still_finds_limited_tasks(
    worker_process: Callable[..., WorkerProcess], events: EventLog, tmp_path: Path
) -> None:
    """Every claim of a worker with a long backlog is full: limited tasks are still found."""
    from django_sqltasks.compat import task_backends
    from tests import tasks

    task_backends["default"].enqueue_many(tasks.sleep, [((0.005,), {})] * 3000)
    worker = worker_process("--concurrency", "4", "--prefetch", "0")
    events.wait("task_finished")
    limited = tasks_limits.two_at_once.enqueue(str(tmp_path / "log"), "l")
    events.wait("task_finished", id=str(limited.id), status="SUCCESSFUL")
    backlog = TaskRecord.objects.filter(status="READY", limit_key__isnull=True).count()
    worker.stop()
    assert backlog > 0, "the backlog ran dry first: the test proves nothing"


def test_limit_rows_untouched_for_hours_are_forgotten_and_made_again(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    tasks_limits.two_at_once.enqueue(log, "a")
    make_due()
    worker = limited_claim()
    claim(worker)
    key = "task:tests.tasks_limits.two_at_once"
    TaskLimit.objects.create(backend_name="default", key="task:gone#old")
    TaskLimit.objects.filter(key="task:gone#old").update(
        updated_at=timezone.now() - timedelta(hours=3)
    )
    with connection.cursor() as cursor:
        assert worker.forget_stale(dialect_for(connection), cursor) == 1
    assert list(TaskLimit.objects.values_list("key", flat=True)) == [key]
    TaskLimit.objects.all().delete()  # even a live limit's row: the next claim makes it again
    tasks_limits.two_at_once.enqueue(log, "b")
    make_due()
    assert len(claim(worker)) == 1  # one of two slots is taken by "a"
    assert TaskLimit.objects.filter(key=key).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker_process
def test_a_killed_workers_slot_comes_back_with_the_rescue(
    worker_process: Callable[..., WorkerProcess], events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    """SIGKILL the worker holding the only slot of a limit: the rescue frees it, the task and
    the one queued behind it run on another worker, never side by side."""
    log = tmp_path / "log"
    first = tasks_limits.one_per_customer.enqueue(str(log), "acme", "first", gate=gate.path)
    second = tasks_limits.one_per_customer.enqueue(str(log), "acme", "second")
    victim = worker_process("--concurrency", "2", "--worker-id", "victim")
    events.wait("note", what="start", label="acme:first")
    victim.kill()
    victim.wait()
    assert TaskRecord.objects.get(id=second.id).status == "READY"  # the limit held it back
    expire_lease("victim")
    gate.open()
    rescuer = worker_process("--concurrency", "2", "--worker-id", "rescuer")
    for result in (first, second):
        events.wait("task_finished", id=str(result.id), status="SUCCESSFUL")
    rescuer.stop()
    assert most_at_once(intervals(log)) == 1
    assert TaskRecord.objects.get(id=first.id).worker_ids == ["victim", "rescuer"]
