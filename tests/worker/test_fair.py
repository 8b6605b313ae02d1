"""Fair queues (``@task(fair_key=...)``): waiting tasks taken round robin across keys within a
priority, with limits, by a worker; bad keys refused; on every database."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection

from django_sqltasks.compat import InvalidTask, task
from django_sqltasks.models import TaskRecord
from django_sqltasks.sql import ClaimedRow, Scope, dialect_for
from django_sqltasks.worker.fair import fair_round
from django_sqltasks.worker.limited import LimitedClaim
from tests import tasks_fair
from tests.conftest import WorkerProcess, expire_lease
from tests.events import EventLog, Gate
from tests.factories import plan_uses
from tests.test_indexes import analyze, explain
from tests.worker.test_limited import finish, make_due

pytestmark = pytest.mark.django_db

PATH = "tests.tasks_fair.per_tenant"


def fair_claim(worker_id: str = "w1") -> LimitedClaim:
    return LimitedClaim(
        backend_name="default",
        database="default",
        worker_id=worker_id,
        queue_names=None,
        queue_limits={},
    )


def claim(limited: LimitedClaim, room: int) -> list[ClaimedRow]:
    with connection.cursor() as cursor:
        limited.scan(dialect_for(connection), cursor, force=True)
        return limited.claim(dialect_for(connection), cursor, room)


def tenants(rows: list[ClaimedRow]) -> list[str]:
    return sorted(r.args[1] for r in rows)


def enqueue(tenant: str, count: int, priority: int = 0, log: str = "log") -> None:
    task = tasks_fair.per_tenant.using(priority=priority)
    task.get_backend().enqueue_many(
        task, [((log, tenant, f"{tenant}{i}"), {}) for i in range(count)]
    )


# The key ----------------------------------------------------------------------------------


def test_a_fair_task_is_stored_under_its_key_and_left_by_the_main_claim() -> None:
    result = tasks_fair.per_tenant.enqueue("log", "acme", "a")
    tasks_fair.unfair.enqueue("log", "acme", "b")
    assert TaskRecord.objects.get(id=result.id).limit_key == f"fair:{PATH}#acme"
    make_due()
    with connection.cursor() as cursor:
        rows = dialect_for(connection).claim(
            cursor, backend_name="default", queue_names=None, worker_id="main", limit=10
        )
    assert [r.task_path for r in rows] == ["tests.tasks_fair.unfair"]


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (lambda *a: 1 / 0, "The fair_key callable of {path} raised ZeroDivisionError"),
        (lambda *a: 42, "The fair_key callable of {path} must return a non-empty str, not 42"),
        (lambda *a: "", "The fair_key callable of {path} must return a non-empty str, not ''"),
        (lambda *a: "x" * 201, "returned a key of 201 characters, over the 200 a fair key"),
        (lambda *a: "a\ud800", "returned the key 'a\\ud800', which contains a lone surrogate"),
        (lambda *a: "a\x00b", "returned the key 'a\\x00b', which contains a NUL character"),
    ],
)
def test_a_bad_fair_key_fails_its_enqueue_naming_the_field_and_rule(
    key: Callable[..., object], message: str
) -> None:
    bad = task(fair_key=key)(tasks_fair.undecorated)
    expected = message.format(path="tests.tasks_fair.undecorated")
    with pytest.raises(InvalidTask, match=re.escape(expected)):
        bad.enqueue("log", "acme", "a")
    assert not TaskRecord.objects.exists()


def test_one_bad_key_in_enqueue_many_is_named_and_nothing_is_written() -> None:
    task_ = tasks_fair.per_tenant
    calls: list[tuple[tuple[str, ...], dict[str, str]]] = [
        (("log", "acme", "a"), {}),
        (("log", "x" * 201, "b"), {}),
    ]
    with pytest.raises(InvalidTask, match=re.escape("calls[1]: The fair_key callable of")):
        task_.get_backend().enqueue_many(task_, calls)
    assert not TaskRecord.objects.exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"fair_key": "tenant"}, "fair_key must be a callable or 'subject', not 'tenant'"),
        ({"fair_key": 5}, "fair_key must be a callable or 'subject', not 5"),
        (
            {"fair_key": str, "concurrency_limit": 1, "concurrency_key": repr},
            "fair_key and concurrency_key must be the same when both are set",
        ),
        ({"fair_key": "subject"}, "keys its fair_key by subject (fair_key='subject')"),
    ],
)
def test_bad_fair_key_options_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidTask, match=re.escape(message)):
        task(**options)(tasks_fair.undecorated).enqueue("log", "acme", "a")


def test_a_subject_fair_key_is_the_subject() -> None:
    user = User.objects.create(username="someone")
    keyed = task(fair_key="subject")(tasks_fair.undecorated)
    result = keyed.using(subject=user).enqueue("log", "acme", "a")
    key = TaskRecord.objects.get(id=result.id).limit_key
    assert key == f"fair:tests.tasks_fair.undecorated#auth.user:{user.pk}"


# The claim --------------------------------------------------------------------------------


def test_claims_go_round_robin_across_keys_not_in_arrival_order() -> None:
    enqueue("big", 20)
    for tenant in ("a", "b", "c"):
        enqueue(tenant, 2)
    make_due()
    limited = fair_claim()
    first = claim(limited, 4)
    assert tenants(first) == ["a", "b", "big", "c"]  # one each, though "big" came first
    second = claim(limited, 4)
    assert tenants(second) == ["a", "b", "big", "c"]
    # Only "big" is left: it fills the batch alone.
    assert tenants(claim(limited, 6)) == ["big"] * 6


def test_a_small_batch_goes_on_where_the_last_one_stopped() -> None:
    for tenant in ("a", "b", "c", "d", "e"):
        enqueue(tenant, 3)
    make_due()
    limited = fair_claim()
    seen = [tenants(claim(limited, 2)) for _ in range(5)]
    # Every key in the first three batches, and twice in five: none waits two turns.
    assert {t for batch in seen[:3] for t in batch} == {"a", "b", "c", "d", "e"}
    assert sorted(t for batch in seen for t in batch) == sorted("abcde" * 2)


def test_priorities_come_first_and_keys_share_within_a_priority() -> None:
    enqueue("big", 10, priority=0)
    enqueue("big", 1, priority=5)
    enqueue("small", 1, priority=0)
    enqueue("urgent", 2, priority=10)
    make_due()
    limited = fair_claim()
    assert [(r.args[1], r.priority) for r in claim(limited, 2)] == [
        ("urgent", 10),
        ("urgent", 10),
    ]
    assert [(r.args[1], r.priority) for r in claim(limited, 1)] == [("big", 5)]
    assert sorted((r.args[1], r.priority) for r in claim(limited, 2)) == [
        ("big", 0),
        ("small", 0),
    ]


def test_a_fair_task_with_a_concurrency_limit_shares_it_across_keys() -> None:
    for tenant, count in (("big", 6), ("small", 1)):
        for i in range(count):
            tasks_fair.per_tenant_two_at_once.enqueue("log", tenant, f"{tenant}{i}")
    make_due()
    first = claim(fair_claim("w1"), 10)
    assert tenants(first) == ["big", "small"]  # the two slots, one each
    assert claim(fair_claim("w2"), 10) == []  # the task's limit is full, for every key
    finish(first)
    assert tenants(claim(fair_claim("w2"), 10)) == ["big", "big"]


def test_a_fair_concurrency_key_is_one_at_a_time_per_key_round_robin() -> None:
    for tenant, count in (("big", 5), ("a", 2), ("b", 2)):
        for i in range(count):
            tasks_fair.one_per_tenant.enqueue("log", tenant, f"{tenant}{i}")
    make_due()
    rows = claim(fair_claim(), 10)
    assert tenants(rows) == ["a", "b", "big"]
    assert {r.args[1] for r in rows} == {"a", "b", "big"}


def test_the_round_splits_a_batch_evenly() -> None:
    def claim_of(wants: Sequence[tuple[str, int]], priority: int) -> list[list[str]]:
        return [[g] * min(n, {"a": 100, "b": 1, "c": 100}[g]) for g, n in wants]

    rows, last = fair_round(
        ["a", "b", "c"],
        9,
        priorities=lambda gs: [[0] for _ in gs],
        allowed=lambda g: None,
        take=lambda g, n: None,
        claim=claim_of,
    )
    assert sorted(rows) == ["a"] * 4 + ["b"] + ["c"] * 4
    assert last == 2


def test_a_new_key_among_many_is_served_at_the_next_round() -> None:
    """A key enqueued while more keys wait than a scan reads (500) was seen only when the
    scans came round to it: up to 107 s at 100,000 keys. Now each scan reads the keys of the
    tasks enqueued since the last one, and the next round serves a new key first."""
    task = tasks_fair.per_tenant
    task.get_backend().enqueue_many(task, [(("log", f"k{i:04d}", "x"), {}) for i in range(1_200)])
    make_due()
    limited = fair_claim()
    assert len(claim(limited, 10)) == 10  # the first scan: 500 keys of 1,200
    new = tasks_fair.per_tenant.enqueue("log", "a-new", "new").id
    make_due()
    rows = claim(limited, 10)  # the next scan, and its round
    assert new in {str(r.id) for r in rows}, tenants(rows)


def test_a_round_reads_its_keys_in_two_statements_on_postgresql(
    django_assert_max_num_queries: Callable[..., object],
) -> None:
    """A round read each key's due priorities, then claimed each key's share, one statement
    a key: 100 round trips for 50 keys, 377 tasks a second at 100,000 keys. On PostgreSQL
    the round's keys now take two: their priorities, and one claim a pass."""
    if connection.vendor != "postgresql":
        pytest.skip("the statements that serve many keys at once are PostgreSQL's")
    task = tasks_fair.per_tenant
    task.get_backend().enqueue_many(task, [(("log", f"k{i:02d}", "x"), {}) for i in range(50)])
    make_due()
    limited = fair_claim()
    with connection.cursor() as cursor:
        limited.scan(dialect_for(connection), cursor, force=True)
    # The round's transaction: the limit rows (none here), the clock, two statements.
    with django_assert_max_num_queries(6), connection.cursor() as cursor:
        rows = limited.claim(dialect_for(connection), cursor, 50)
    assert len({r.args[1] for r in rows}) == 50


# A worker ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker_process_core  # the fair claim is written per database
def test_a_worker_runs_the_small_keys_between_the_big_backlog(
    worker_process: Callable[..., WorkerProcess], events: EventLog, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    enqueue("big", 40, log=str(log))
    for tenant in ("a", "b", "c", "d"):
        enqueue(tenant, 2, log=str(log))
    for i in range(3):
        tasks_fair.unfair.enqueue(str(log), "plain", f"p{i}")
    worker = worker_process("--concurrency", "2", "--burst")
    events.wait("task_finished", count=51, timeout=60)
    worker.stop()
    order = tasks_fair.started(log)
    assert len(order) == len(set(order)) == 51
    smalls = [i for i, entry in enumerate(order) if entry.split(":")[0] in "abcd"]
    # The other keys' 8 tasks ran among the first 20, not after the 40 of "big".
    assert max(smalls) < 20, order
    assert TaskRecord.objects.exclude(status="SUCCESSFUL").count() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker_process
def test_a_killed_workers_fair_task_is_rescued_and_the_keys_go_on(
    worker_process: Callable[..., WorkerProcess], events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    """SIGKILL the worker running a fair task: the rescue puts it back under its key, and
    another worker runs it and the other key's tasks, each once."""
    log = str(tmp_path / "log")
    stuck = tasks_fair.gated.enqueue(log, "a", "stuck", gate=gate.path)
    others = [tasks_fair.gated.enqueue(log, "b", f"b{i}") for i in range(3)]
    victim = worker_process("--concurrency", "1", "--worker-id", "victim")
    events.wait("note", what="start", label="stuck")
    victim.kill()
    victim.wait()
    expire_lease("victim")
    gate.open()
    rescuer = worker_process("--concurrency", "2", "--worker-id", "rescuer")
    for result in (stuck, *others):
        events.wait("task_finished", id=str(result.id), status="SUCCESSFUL")
    rescuer.stop()
    assert sorted(tasks_fair.started(tmp_path / "log")) == ["a:stuck", "b:b0", "b:b1", "b:b2"]
    row = TaskRecord.objects.get(id=stuck.id)
    assert row.worker_ids == ["victim", "rescuer"]
    assert row.limit_key == "fair:tests.tasks_fair.gated#a"


# The plans --------------------------------------------------------------------------------


@pytest.mark.large_table
@pytest.mark.django_db(transaction=True)  # ANALYZE TABLE commits on MySQL
def test_the_fair_claim_reads_the_limited_ready_index_without_sorting() -> None:
    """Beside 20,000 waiting tasks of one key, a key's priorities and its claim read the
    limited ready index, and the claim reads the key's tasks in its order, sorting none."""
    enqueue("big", 20_000)
    enqueue("small", 3)
    make_due()
    analyze()
    dialect = dialect_for(connection)
    sorted_all = {"postgresql": "Sort", "sqlite": "TEMP B-TREE", "mysql": "filesort"}
    for key in ("big", "small"):
        scope = Scope(limit_key=f"fair:{PATH}#{key}", priority=0)
        probe = dialect._due_priorities_sql("default", None, Scope(limit_key=scope.limit_key))
        if connection.vendor == "postgresql":
            claim_sql = dialect.claim_sql(
                backend_name="default", queue_names=None, worker_id="w", limit=3, scope=scope
            )
        else:
            ready = dialect._ready_where("default", None, scope)
            claim_sql = dialect._claim_step_sql(ready, "w", 3, [0])
        for sql, params in (probe, claim_sql):
            plan = explain(sql, params)
            # MySQL and MariaDB have no partial index: their ready indexes lead with status and
            # limit_key, so either serves one key's rows in order.
            assert plan_uses(plan, "sqltasks_ready_limited_idx") or (
                connection.vendor == "mysql" and "sqltasks_ready_all_idx" in plan
            ), plan
        # The probe sorts the few priorities it found; the claim sorts nothing.
        assert sorted_all[connection.vendor] not in explain(*claim_sql), explain(*claim_sql)
