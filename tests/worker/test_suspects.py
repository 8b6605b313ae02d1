"""A task that kills its worker is the one charged: the tasks that ran beside it become
suspects (limited and fair ones too), each runs alone in one slot of a worker next, and only a
task whose worker dies while it runs alone is charged a rescue (MAX_RESCUES). A suspect takes
one slot, not the worker: the other slots keep working, and after its time bound (the lease
timeout) the next suspect may start beside it. Suspects keep their limits. Real worker
processes, as the crash is the subject."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import TaskRecord
from django_sqltasks.sql.rows import SUSPECT_CLEARED, stored, suspect_at
from tests import tasks_processes as tasks
from tests.conftest import WorkerProcess
from tests.events import EventLog, Gate
from tests.factories import task_row

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker_process]

StartWorker = Callable[..., WorkerProcess]
# One rescue allowed: the crashing task dies once beside the others, once beside them again as
# the suspects of that death, once alone (charged 1), and fails the next time alone.
ENV = {
    "SQLTASKS_LEASE_TIMEOUT": "20",  # dead children are rescued at once; no lease runs out here
    "SQLTASKS_HEARTBEAT_INTERVAL": "0.25",
    "SQLTASKS_MAX_RESCUES": "1",
}
WORKER_LOST = "django_sqltasks.exceptions.WorkerLost"


def _finished(ids: list[str]) -> bool:
    return not TaskRecord.objects.filter(
        id__in=ids, status__in=[TaskResultStatus.READY, TaskResultStatus.RUNNING]
    ).exists()


def _enqueue(marker: Path, gate: Gate, status: int = 1) -> tuple[str, list[str]]:
    """A task that kills its worker once the three others run beside it; they wait at
    ``gate``, which the test opens once that worker is dead."""
    crasher = tasks.kill_worker.enqueue(str(marker), 3, status).id
    innocents = [tasks.record_at_gate.enqueue(str(marker), gate.path).id for _ in range(3)]
    return crasher, innocents


def _enqueue_members(kind: str, marker: Path, gate: Gate) -> tuple[str, list[str]]:
    """The same, as four tasks of one fair task (a key each) or of one concurrency limit: the
    limited claim takes them together. ``mixed``: a limited poison beside a fair, a limited and
    a plain innocent, which the limited and the plain claims take into one worker."""
    if kind == "mixed":
        crasher = tasks.limited_member.enqueue(str(marker), gate.path, "t0", kill=True).id
        innocents = [
            tasks.fair_member.enqueue(str(marker), gate.path, "t1").id,
            tasks.limited_member.enqueue(str(marker), gate.path, "t2").id,
            tasks.record_at_gate.enqueue(str(marker), gate.path).id,
        ]
        return crasher, innocents
    member = tasks.fair_member if kind == "fair" else tasks.limited_member
    crasher = member.enqueue(str(marker), gate.path, "t0", kill=True).id
    innocents = [member.enqueue(str(marker), gate.path, f"t{i}").id for i in range(1, 4)]
    return crasher, innocents


def _suspect(task: str, *args: object, **fields: object) -> str:
    """A suspect, as a rescue leaves it: READY, to run alone."""
    row = task_row(
        task_path=f"tests.tasks_processes.{task}",
        args=list(args),
        available_at=suspect_at(),
        **fields,
    )
    return str(row.id)


def _lines(path: Path) -> list[str]:
    """What the runs wrote in ``path``: start, end, ... (without the pids)."""
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def _assert_only_the_crasher_failed(crasher: str, innocents: list[str]) -> None:
    for task_id in innocents:
        record = TaskRecord.objects.get(id=task_id)
        assert record.status == TaskResultStatus.SUCCESSFUL, record.errors
        assert record.rescues == 0, (record.errors, record.worker_ids)
    record = TaskRecord.objects.get(id=crasher)
    assert record.status == TaskResultStatus.FAILED
    assert record.errors[-1]["exception_class_path"] == WORKER_LOST
    assert "MAX_RESCUES is 1" in record.errors[-1]["traceback"]
    # Charged only for the deaths while it ran alone: never for the first, beside the others,
    # nor the second, beside them as suspects of that death.
    assert record.rescues == 2
    assert "beside the other tasks that lost a worker" in record.errors[0]["traceback"]


def test_under_a_supervisor_the_crashing_task_fails_alone(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    crasher, innocents = _enqueue(marker, gate)
    supervisor = worker_process(
        "--processes", "2", "-c", "4", "--prefetch", "0", "--worker-id", "suspects", env=ENV
    )
    events.wait("registered", count=3)  # a replacement: the first death's tasks were rescued
    gate.open()
    events.until(lambda: _finished([crasher, *innocents]), "every task to end", timeout=90)
    _assert_only_the_crasher_failed(crasher, innocents)
    assert "alone" in supervisor.output
    supervisor.stop()


def test_a_child_that_exits_zero_mid_task_has_its_tasks_rescued_at_once(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    """Status 0 is no recycle when tasks were left RUNNING: they are rescued now, not after a
    lease (here 120 s, far beyond the wait)."""
    marker = tmp_path / "ran"
    crasher, innocents = _enqueue(marker, gate, status=0)
    supervisor = worker_process(
        "--processes",
        "1",
        "-c",
        "4",
        "--prefetch",
        "0",
        env={**ENV, "SQLTASKS_LEASE_TIMEOUT": "120"},
    )
    events.wait("registered", count=2)  # a replacement: the first death's tasks were rescued
    gate.open()
    events.until(lambda: _finished([crasher, *innocents]), "every task to end")
    _assert_only_the_crasher_failed(crasher, innocents)
    supervisor.stop()


def test_a_restarted_single_worker_runs_the_suspects_alone(
    worker_process: StartWorker, gate: Gate, tmp_path: Path
) -> None:
    """A single-process worker restarted under its own id (as a service manager does): it
    takes the dead one's name at once, as that process is gone from this host, and rescues
    its tasks instead of waiting for the lease (here 120 s)."""
    marker = tmp_path / "ran"
    crasher, innocents = _enqueue(marker, gate)
    env = {**ENV, "SQLTASKS_LEASE_TIMEOUT": "120"}
    # Each time, a burst worker: it runs until the task kills it, or until nothing is left.
    for _ in range(10):
        worker = worker_process(
            "--burst", "-c", "4", "--prefetch", "0", "--worker-id", "solo", env=env
        )
        if worker.wait() == 0:
            break
        assert worker.wait() == 1, worker.output  # killed by the task
        gate.open()
    _assert_only_the_crasher_failed(crasher, innocents)


@pytest.mark.worker_process_core
def test_the_suspects_of_a_crash_with_no_poison_cost_one_tasks_time_not_their_sum(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    """Six tasks of 4 s each were running when their worker was killed (an OOM kill, a
    deploy): they ran alone one after another, 4 s apart, 24 s for the six. As the suspects of
    a first death they run beside each other in half of the worker's slots (6 of 12): about one
    task's time."""
    marker = tmp_path / "ran"
    # Each waits at the gate before its 4 s, so that none can end before the kill, however
    # slowly the six start on a loaded machine.
    six = [tasks.record.enqueue(str(marker), 4.0, gate.path).id for _ in range(6)]
    env = {**ENV, "SQLTASKS_LEASE_TIMEOUT": "120"}
    args = ("-c", "12", "--prefetch", "0", "--worker-id", "solo")
    first = worker_process(*args, env=env)
    events.wait("note", what="start", count=6)
    first.kill()
    first.wait()
    gate.open()
    # Restarted under its id: it rescues the dead one's tasks at once, then runs them.
    second = worker_process("--burst", *args, env=env)
    assert second.wait() == 0, second.output
    records = TaskRecord.objects.filter(id__in=six)
    assert {(r.status, r.rescues) for r in records} == {(TaskResultStatus.SUCCESSFUL, 0)}
    assert all("beside others" in r.errors[0]["traceback"] for r in records)
    began = min(r.last_attempted_at for r in records)
    ended = max(r.finished_at for r in records)
    print(f"\nsix 4 s suspects ran in {(ended - began).total_seconds():.1f}s")
    assert (ended - began).total_seconds() < 12, [
        (r.last_attempted_at, r.finished_at) for r in records
    ]


@pytest.mark.worker_process_core
@pytest.mark.parametrize("kind", ["fair", "limited", "mixed"])
def test_a_poison_among_limited_or_fair_tasks_fails_alone_under_a_restart_loop(
    worker_process: StartWorker, gate: Gate, tmp_path: Path, kind: str
) -> None:
    """The poison and its innocents are of one fair task, or one concurrency limit (the
    limited claim takes them together), or a mix of limited, fair and plain tasks. Its limited
    and fair innocents were charged at each rescue and taken with it again, and failed after
    MAX_RESCUES; now they become suspects like any other."""
    marker = tmp_path / "ran"
    crasher, innocents = _enqueue_members(kind, marker, gate)
    env = {**ENV, "SQLTASKS_LEASE_TIMEOUT": "120"}
    for _ in range(10):
        worker = worker_process(
            "--burst", "-c", "4", "--prefetch", "0", "--worker-id", "solo", env=env
        )
        if worker.wait() == 0:
            break
        assert worker.wait() == 1, worker.output  # killed by the task
        gate.open()
    _assert_only_the_crasher_failed(crasher, innocents)


@pytest.mark.worker_process_core
@pytest.mark.parametrize("kind", ["fair", "limited", "mixed"])
def test_a_poison_among_limited_or_fair_tasks_fails_alone_under_a_supervisor(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path, kind: str
) -> None:
    marker = tmp_path / "ran"
    crasher, innocents = _enqueue_members(kind, marker, gate)
    supervisor = worker_process(
        "--processes", "2", "-c", "4", "--prefetch", "0", "--worker-id", "suspects", env=ENV
    )
    events.wait("registered", count=3)  # a replacement: the first death's tasks were rescued
    gate.open()
    events.until(lambda: _finished([crasher, *innocents]), "every task to end", timeout=90)
    _assert_only_the_crasher_failed(crasher, innocents)
    supervisor.stop()


@pytest.mark.worker_process_core
def test_a_suspect_takes_one_slot_and_the_others_keep_working(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    """A worker took a suspect alone and claimed nothing else while it ran: a crash made a
    worker of 4 slots a worker of 1. Now the suspect runs in one slot, fresh tasks in the
    others, and the next suspect waits for the first (one at a time, to tell which kills)."""
    marker = tmp_path / "suspects"
    suspects = [_suspect("record_at_gate", str(marker), gate.path) for _ in range(2)]
    fresh = [tasks.record.enqueue(str(tmp_path / "fresh")).id for _ in range(6)]
    worker = worker_process("-c", "4", "--prefetch", "0", env=ENV)
    events.wait("note", what="start")  # a suspect runs
    events.until(lambda: _finished(fresh), "the fresh tasks to end beside the suspect")
    assert _lines(marker) == ["start"]  # the second suspect waits for the first
    gate.open()
    events.until(lambda: _finished(suspects), "the suspects to end")
    assert _lines(marker) == ["start", "end", "start", "end"]
    for task_id in suspects:
        record = TaskRecord.objects.get(id=task_id)
        assert (record.status, record.rescues) == (TaskResultStatus.SUCCESSFUL, 0)
    assert "alone in one slot" in worker.output
    worker.stop()


@pytest.mark.worker_process_core
def test_a_suspect_past_its_time_bound_no_longer_holds_back_the_next(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    """A suspect that runs for hours held its worker (and every suspect after it) that long.
    After LEASE_TIMEOUT its worker clears it, and the next suspect starts beside it."""
    long = _suspect("record_at_gate", str(tmp_path / "long"), gate.path, priority=1)
    short = _suspect("record", str(tmp_path / "short"))
    worker = worker_process(
        "-c", "2", "--prefetch", "0", env={**ENV, "SQLTASKS_LEASE_TIMEOUT": "1"}
    )
    [cleared] = events.wait("suspect_cleared")
    assert cleared.fields["task_id"] == long
    events.until(lambda: _finished([short]), "the next suspect to run beside the first")
    record = TaskRecord.objects.get(id=long)
    assert (record.status, record.available_at) == ("RUNNING", stored(SUSPECT_CLEARED))
    gate.open()
    events.until(lambda: _finished([long]), "the first suspect to end")
    for task_id in (long, short):
        assert TaskRecord.objects.get(id=task_id).status == TaskResultStatus.SUCCESSFUL
    worker.stop()


@pytest.mark.worker_process_core
def test_suspects_keep_their_queue_rate_limit(
    worker_process: StartWorker, events: EventLog, tmp_path: Path
) -> None:
    """Suspects were claimed around QUEUE_LIMITS: a rate of 3 a minute let all 5 start."""
    marker = tmp_path / "ran"
    suspects = [_suspect("record", str(marker), queue_name="slow") for _ in range(5)]
    env = {**ENV, "SQLTASKS_QUEUE_LIMITS": json.dumps({"slow": {"rate": "3/m"}})}
    worker = worker_process("-c", "4", "--prefetch", "0", "--queue", "slow", env=env)
    events.until(
        lambda: TaskRecord.objects.filter(id__in=suspects, status="SUCCESSFUL").count() == 3,
        "three suspects to run",
    )
    mark = events.mark()
    events.wait("rescue_pass", count=8, after=mark)  # heartbeats: the worker looked again
    assert _lines(marker).count("start") == 3
    assert TaskRecord.objects.filter(id__in=suspects, status="READY").count() == 2
    worker.stop()


@pytest.mark.worker_process_core
def test_suspects_keep_their_queue_concurrency_limit(
    worker_process: StartWorker, events: EventLog, gate: Gate, tmp_path: Path
) -> None:
    """A queue of concurrency 1 ran a suspect beside its running task, on an idle worker."""
    marker = tmp_path / "ran"
    env = {**ENV, "SQLTASKS_QUEUE_LIMITS": json.dumps({"slow": {"concurrency": 1}})}
    workers = [
        worker_process("-c", "2", "--prefetch", "0", "--queue", "slow", env=env) for _ in range(2)
    ]
    events.wait("worker_started", count=2)
    running = tasks.record_at_gate.using(queue_name="slow").enqueue(str(marker), gate.path).id
    events.wait("note", what="start")
    suspect = _suspect("record_at_gate", str(marker), gate.path, queue_name="slow")
    mark = events.mark()
    events.wait("rescue_pass", count=8, after=mark)  # heartbeats: both workers looked
    assert _lines(marker) == ["start"]
    gate.open()
    events.until(lambda: _finished([running, suspect]), "both to end")
    assert _lines(marker) == ["start", "end", "start", "end"]
    for worker in workers:
        worker.stop()
