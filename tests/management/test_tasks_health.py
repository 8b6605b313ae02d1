"""``manage.py tasks_health``: a probe's exit status for each condition, its JSON, its speed."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.core.claim_cost import ClaimCost
from django_sqltasks.models import PausedQueue, TaskRecord, WorkerRecord
from django_sqltasks.ops.probe_report import Exit
from django_sqltasks.sql import dialect_for
from tests.conftest import wait_for
from tests.factories import task_row, worker_row
from tests.management.test_tasks_worker import closed_port, manage, url_for_port
from tests.ops.test_health import INNODB_TRX_IDLE
from tests.ops.test_health import snapshot as held_snapshot  # noqa: F401 (a fixture)
from tests.test_indexes import analyze, explain, fill, plan_uses

pytestmark = pytest.mark.django_db


def health(*args: str) -> tuple[int, str]:
    """Run the command; return its exit status and what it printed."""
    out = StringIO()
    try:
        call_command("tasks_health", *args, stdout=out)
    except CommandError as e:
        return e.returncode, out.getvalue()
    return 0, out.getvalue()


def worker(queues: list[str], silent_for: timedelta = timedelta(0), name: str = "w1") -> None:
    WorkerRecord.objects.create(
        id=name,
        backend_name="default",
        queue_names=queues,
        heartbeat_at=timezone.now() - silent_for,
    )


def test_a_live_worker_on_every_queue_and_nothing_late_is_healthy() -> None:
    worker(["*"])
    task_row(available_at=timezone.now() - timedelta(seconds=30))
    task_row(TaskResultStatus.FAILED, finished_ago=timedelta(days=3))  # history: not read
    code, out = health()
    assert code == 0, out
    assert out.splitlines()[-1] == "OK"
    assert "default: served, oldest due 30s" in out or "oldest due 29s" in out


def test_no_live_worker() -> None:
    worker(["*"], silent_for=timedelta(minutes=5))  # its row is left, its heartbeat old
    code, out = health()
    assert code == Exit.NO_LIVE_WORKER == 4
    assert "No live worker of backend 'default'" in out


def test_a_queue_no_live_worker_serves() -> None:
    worker(["default", "other"])
    worker(["slow"], silent_for=timedelta(minutes=5), name="gone")
    code, out = health()
    assert code == Exit.QUEUE_UNSERVED == 5
    assert "Queue 'slow' of backend 'default' is served by no live worker." in out
    assert "'other'" not in out.split("QUEUE_UNSERVED")[-1]
    assert health("-Q", "default,other")[0] == 0


def test_a_queue_outside_queues_with_ready_tasks_is_checked() -> None:
    """A task enqueued under older settings names a queue QUEUES no longer lists."""
    worker(["default", "other", "slow"])
    task_row(queue_name="retired", available_at=timezone.now() - timedelta(seconds=5))
    code, out = health("--json")
    assert code == Exit.QUEUE_UNSERVED
    report = json.loads(out)
    assert [p["queue"] for p in report["problems"]] == ["retired"]


def test_the_oldest_due_task_against_max_age() -> None:
    worker(["*"])
    now = timezone.now()
    task_row(queue_name="other", available_at=now - timedelta(minutes=10))
    task_row(queue_name="other", available_at=now + timedelta(hours=2))  # not due: no age
    task_row(
        queue_name="slow", available_at=now - timedelta(minutes=20), limit_key="tests.tasks.add"
    )  # under a limit: read through the other ready index
    code, out = health()
    assert code == Exit.BACKLOG_TOO_OLD == 6
    assert "The oldest due task of queue 'other'" in out
    assert "queue 'slow'" in out and "over the 300s allowed (--max-age)" in out
    assert health("--max-age", "1500")[0] == 0
    assert health("--max-age", "900")[0] == Exit.BACKLOG_TOO_OLD
    PausedQueue.objects.create(backend_name="default", queue_name="other")
    PausedQueue.objects.create(backend_name="default", queue_name="slow")
    assert health()[0] == 0  # paused: waiting on purpose


def test_the_lowest_status_wins_and_json_lists_every_problem() -> None:
    worker(["default"], silent_for=timedelta(hours=1))
    task_row(available_at=timezone.now() - timedelta(hours=1))
    code, out = health("--json")
    assert code == Exit.NO_LIVE_WORKER
    report = json.loads(out)
    assert report["healthy"] is False and report["exit"] == 4
    assert [p["code"] for p in report["problems"]] == ["no_live_worker", "backlog_too_old"]
    (backend,) = report["backends"]
    assert backend["backend"] == "default" and backend["live_workers"] == []
    queues = {q["queue"]: q for q in backend["queues"]}
    assert set(queues) == {"default", "other", "slow"}
    assert queues["default"]["oldest_due_seconds"] > 3500
    assert queues["other"] == {
        "queue": "other",
        "served": False,
        "paused": False,
        "oldest_due_seconds": None,
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "nope"], "--backend: 'nope' is not a django_sqltasks backend"),
        (["--backend", "immediate"], "'immediate' is not a django_sqltasks backend"),
        (["-Q", "emails"], "--queue: 'emails' is not a queue of backend 'default'"),
        (["--max-age", "0"], "must be a positive, finite number"),
        (["--max-age", "soon"], "must be a number of seconds, not 'soon'"),
    ],
)
def test_bad_options_name_the_option_and_the_rule(args: list[str], message: str) -> None:
    with pytest.raises(CommandError) as caught:
        call_command("tasks_health", *args)
    assert message in str(caught.value)


@pytest.mark.django_db  # the probe reaches no database: no row to share
def test_an_unreachable_database_exits_3_in_one_line() -> None:
    if connection.vendor == "sqlite":
        env = {"SQLTASKS_TEST_DB_NAME": "/nonexistent-directory/tasks.sqlite3"}
    else:
        env = {"DATABASE_URL": url_for_port(closed_port())}
    done = manage("tasks_health", env=env)
    assert done.returncode == Exit.DATABASE_UNREACHABLE == 3, done.stderr
    assert "DATABASE_UNREACHABLE: Cannot connect to database 'default'" in done.stdout
    assert "Traceback" not in done.stderr
    done = manage("tasks_health", "--json", env=env)
    assert done.returncode == 3
    assert json.loads(done.stdout)["problems"][0]["code"] == "database_unreachable"


@pytest.mark.large_table
@pytest.mark.django_db(transaction=True)  # ANALYZE TABLE commits on MySQL
def test_the_probe_reads_one_entry_of_a_ready_index_per_queue_and_priority() -> None:
    fill(ready=3_000, finished=10_000)
    analyze()
    dialect = dialect_for(connection)
    plan = explain(*dialect._oldest_ready_sql("default", "default"))
    assert plan_uses(plan, "sqltasks_ready_idx"), plan
    assert "_successful" not in plan and "_failed" not in plan, plan  # no history read
    plan = explain(*dialect._oldest_limited_sql("default", 100))
    # A table partitioned by status (PostgreSQL) may answer from its live leaf alone, which
    # holds only READY and RUNNING tasks.
    assert plan_uses(plan, "sqltasks_ready_limited_at_idx") or "_live" in plan, plan
    with connection.cursor() as cursor:
        # fill() spreads 3,000 READY tasks over three queues and seven priorities, one a
        # second back in time: the oldest of queue 'default' is row 0's, due now.
        oldest = dialect.oldest_ready(cursor, "default", "default")
        assert (
            oldest
            == TaskRecord.objects.filter(queue_name="default", status="READY")
            .order_by("available_at")
            .values_list("available_at", flat=True)
            .first()
        )
        assert dialect.oldest_ready(cursor, "default", "nowhere") is None


@pytest.mark.skipif("connection.vendor == 'sqlite'", reason="SQLite has no vacuum horizon")
@pytest.mark.django_db(transaction=True)  # the snapshot is another connection's
def test_the_probe_names_the_snapshot_that_holds_the_horizon_back(
    held_snapshot: tuple[Any, int],  # noqa: F811 (the fixture imported above)
) -> None:
    _, pid = held_snapshot  # REPEATABLE READ, application 'h3-report' (PostgreSQL), idle
    worker(["*"])

    def named() -> dict[str, Any] | None:
        (backend,) = json.loads(health("--json")[1])["backends"]
        holder: dict[str, Any] | None = backend["horizon"]
        return holder if holder is not None and holder["pid"] == pid else None

    # MariaDB refreshes innodb_trx at most every 0.1 s: wait until it lists the snapshot.
    holder = wait_for(named, timeout=30, interval=INNODB_TRX_IDLE)
    assert holder["kind"] == "session" and holder["seconds"] >= 0
    code, out = health()
    assert code == 0, out  # younger than --max-transaction-age: a warning, not a failure
    assert "WARNING django_sqltasks.W005: A transaction has been open for " in out
    if connection.vendor == "postgresql":
        assert f"session {pid}, idle in transaction, application 'h3-report'" in out
        assert "query 'SELECT count(*) FROM django_sqltasks_taskrecord'" in out
    wait_for(lambda: health("--max-transaction-age", "0.01")[0] != 0, timeout=30)
    code, out = health("--max-transaction-age", "0.01")
    assert code == Exit.HORIZON_HELD == 7
    [line] = [line for line in out.splitlines() if line.startswith("HORIZON_HELD: ")]
    assert f"session {pid}" in line and "over the 0.01s allowed (--max-transaction-age)" in line


def test_slow_claims_warn_then_fail_with_status_8() -> None:
    slow = ClaimCost(count=40, rows=80, mean=0.12, p99=0.3, max=0.4)
    worker_row("w1", slow)
    worker_row("w2", ClaimCost(count=10, rows=10, mean=0.02, p99=0.02, max=0.02))
    code, out = health()
    assert code == 0, out  # 100 ms on average: over the warning (50 ms), under the failure
    assert "  claims: 50 in the last minute, mean 100 ms, p99 300 ms, max 400 ms" in out
    assert "(2 of 2 live worker(s) reporting)" in out
    assert "WARNING claim_slow: The claims of backend 'default' took 100 ms on average" in out
    assert "over 50 ms (--warn-claim-mean)" in out
    code, out = health("--max-claim-mean", "0.08", "--json")
    assert code == Exit.CLAIM_SLOW == 8
    report = json.loads(out)
    assert [p["code"] for p in report["problems"]] == ["claim_slow"]
    assert "over the 80 ms allowed (--max-claim-mean)" in report["problems"][0]["message"]
    # (beside the task table's, such as W003 where the server's autovacuum is off)
    assert [w["id"] for w in report["warnings"] if w["id"] == "claim_slow"] == ["claim_slow"]
    claims = report["backends"][0]["claims"]
    assert claims["workers"] == 2 and claims["count"] == 50 and claims["rows"] == 90
    assert claims["mean_seconds"] == pytest.approx(0.1) and claims["max_seconds"] == 0.4
    assert health("--warn-claim-mean", "0.2", "--max-claim-mean", "0.5")[1].endswith("OK\n")
    assert health("--warn-claim-mean", "0.05", "--max-claim-mean", "0.5")[0] == 0


def test_claims_no_worker_published_are_unknown_and_never_judged() -> None:
    worker_row("old", ClaimCost(count=9, rows=9, mean=5.0), measured_ago=timedelta(minutes=5))
    worker_row("earlier-version")
    worker_row("busy", ClaimCost(count=0, rows=0))  # every slot busy: no claim in the window
    code, out = health("--warn-claim-mean", "0.000001", "--max-claim-mean", "0.000001")
    assert code == 0, out
    assert "claims: no claim in the last minute (duration unknown) (1 of 3 live" in out
    assert "claim_slow" not in out
    WorkerRecord.objects.filter(id="busy").delete()
    code, out = health("--json", "--warn-claim-mean", "0.000001", "--max-claim-mean", "0.000001")
    assert code == 0 and json.loads(out)["backends"][0]["claims"] is None
    assert "claims: unknown (no fresh figure) (0 of 2 live worker(s) reporting)" in health()[1]


def test_the_claim_warning_may_not_be_above_the_failure() -> None:
    assert health("--warn-claim-mean", "0.5", "--max-claim-mean", "0.1")[0] == 2
    with pytest.raises(CommandError, match=r"--warn-claim-mean \(0.5\) must be at most"):
        call_command("tasks_health", "--warn-claim-mean", "0.5", "--max-claim-mean", "0.1")
