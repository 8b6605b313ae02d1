"""The gauntlet, load: thousands of tasks through several worker processes, and a SIGKILL
mid-batch. Every task runs; none twice unless its worker died holding it."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord, WorkerRecord
from tests import gauntlet_tasks
from tests.conftest import WorkerProcess, expire_lease
from tests.events import EventLog, Gate

pytestmark = [pytest.mark.django_db(transaction=True)]

StartWorker = Callable[..., WorkerProcess]

WORKERS = 3
TASKS = 2000
WORKER_LOST = "django_sqltasks.exceptions.WorkerLost"


def enqueue_marks(log: Path, count: int, seconds: float = 0.0) -> None:
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((str(log), f"t{i}", seconds), {}) for i in range(count)
    ]
    gauntlet_tasks.mark_slowly.get_backend().enqueue_many(gauntlet_tasks.mark_slowly, calls)


def stop_all(workers: list[WorkerProcess]) -> None:
    for worker in workers:
        if worker.proc.poll() is None:
            worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=60) in (0, -signal.SIGKILL), worker.output


@pytest.mark.load
@pytest.mark.worker_process
def test_every_task_runs_exactly_once(
    worker_process: StartWorker, events: EventLog, tmp_path: Path
) -> None:
    log = tmp_path / "executions"
    workers = [worker_process("--concurrency", "8", "--worker-id", f"w{n}") for n in range(WORKERS)]
    events.wait("worker_started", count=WORKERS)
    started = time.monotonic()
    # Enqueued in slices while the workers run, so claims race against inserts.
    for start in range(0, TASKS, 250):
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
            ((str(log), f"t{i}"), {}) for i in range(start, min(start + 250, TASKS))
        ]
        gauntlet_tasks.mark.get_backend().enqueue_many(gauntlet_tasks.mark, calls)
    events.wait("task_finished", count=TASKS, timeout=150)
    elapsed = time.monotonic() - started
    stop_all(workers)

    executions = Counter(gauntlet_tasks.executions(log))
    assert set(executions) == {f"t{i}" for i in range(TASKS)}, "some task never ran"
    assert [label for label, n in executions.items() if n > 1] == [], "a task ran twice"
    assert not TaskRecord.objects.exclude(status=TaskResultStatus.SUCCESSFUL).exists()
    assert set(TaskRecord.objects.values_list("attempts", flat=True)) == {1}
    per_worker = Counter(ids[0] for ids in TaskRecord.objects.values_list("worker_ids", flat=True))
    assert set(per_worker) <= {f"w{n}" for n in range(WORKERS)}
    assert len(per_worker) >= 2, f"expected the work to be shared: {per_worker}"
    print(f"\n{TASKS} tasks, {WORKERS} workers: {elapsed:.1f}s, per worker {dict(per_worker)}")


@pytest.mark.load
@pytest.mark.worker_process
def test_sigkill_mid_batch_runs_its_tasks_again_after_the_lease(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    log = tmp_path / "executions"
    count, through = 400, 24
    # The first tasks run through; the rest hold their slots until the victim is dead.
    enqueue_marks(log, through)
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((str(log), f"t{i}", gate.path), {}) for i in range(through, count)
    ]
    gauntlet_tasks.mark_at_gate.get_backend().enqueue_many(gauntlet_tasks.mark_at_gate, calls)
    victim = worker_process("--concurrency", "8", "--worker-id", "victim")
    # The victim runs alone until it is into the queue, with 8 tasks in flight, and dies.
    events.wait("task_finished", count=through, timeout=60)
    events.wait("note", what="at_gate", count=8)
    in_flight = set(
        TaskRecord.objects.owned_by("victim").values_list("id", flat=True)
    )  # a lower bound: the victim may claim more before the signal lands
    victim.kill()
    killed_at = time.monotonic()
    assert victim.wait() == -signal.SIGKILL
    expire_lease("victim")  # its lease has run out
    gate.open()
    survivor = worker_process("--burst", "--concurrency", "8", "--worker-id", "survivor")
    assert survivor.wait(timeout=90) == 0, survivor.output  # once every task is done
    recovered = time.monotonic() - killed_at

    assert not TaskRecord.objects.running().exists(), "a task stayed RUNNING"
    executions = Counter(gauntlet_tasks.executions(log))
    assert set(executions) == {f"t{i}" for i in range(count)}, "a task was lost"
    rescued = list(TaskRecord.objects.filter(attempts__gt=1))
    assert rescued, "the victim held no task when it was killed"
    # Each task the victim held was rescued, unless its outcome was written between the read
    # above and the kill.
    finished_by_victim = {
        r.id
        for r in TaskRecord.objects.filter(id__in=in_flight, attempts=1)
        if r.worker_ids == ["victim"] and r.status == TaskResultStatus.SUCCESSFUL
    }
    assert in_flight <= {r.id for r in rescued} | finished_by_victim
    for record in rescued:
        assert record.attempts == 2
        assert record.worker_ids == ["victim", "survivor"]
        assert [e["exception_class_path"] for e in record.errors] == [WORKER_LOST]
        assert "Worker victim stopped heartbeating" in record.errors[0]["traceback"]
    # Only a rescued task may have run twice: the victim died after running it.
    rescued_labels = {r.args[1] for r in rescued}
    twice = {label for label, n in executions.items() if n > 1}
    assert twice <= rescued_labels
    assert max(executions.values()) <= 2
    assert "Rescued" in survivor.output
    assert not WorkerRecord.objects.filter(id="victim").exists()
    print(
        f"\nkilled with {len(in_flight)}+ in flight: {len(rescued)} rescued, {len(twice)} ran "
        f"twice, queue drained {recovered:.1f}s after the kill"
    )


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="reads PostgreSQL's plan for the claim"
)
def test_a_wildcard_claim_does_not_sort_the_whole_backlog() -> None:

    from django_sqltasks.sql import dialect_for

    backend = gauntlet_tasks.size.get_backend()
    for queue in ("default", "other"):
        backend.enqueue_many(gauntlet_tasks.size.using(queue_name=queue), [(("x",), {})] * 5000)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {TaskRecord._meta.db_table}")
        sql, params = dialect_for(connection).claim_sql(
            backend_name="default", queue_names=None, worker_id="w", limit=16
        )
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # The picking, before the UPDATE (whose batch, of at most the limit, is sorted back into
    # claim order).
    picking = plan[: plan.index("CTE claimed")]
    assert "Sort" not in picking and "Seq Scan" not in plan, plan
