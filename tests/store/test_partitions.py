"""PostgreSQL's partitioned task table: live tasks apart, finished ones by status and day; pruning
drops whole days and never a live task; statements meeting a task as it moves are run again."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.ids import first_id_at
from django_sqltasks.models import StepRecord, TaskRecord
from django_sqltasks.sql import dialect_for
from django_sqltasks.sql import partitions as sql
from django_sqltasks.store import control, partitions
from django_sqltasks.store.pruning import prune
from tests.factories import task_row

pytestmark = [
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL partitions"),
    # Partitions are dropped and added, and a second connection sees only what is committed.
    pytest.mark.django_db(transaction=True),
]

TABLE = TaskRecord._meta.db_table


def today() -> date:
    return timezone.now().astimezone(sql.dt_timezone.utc).date()


@pytest.fixture(autouse=True)
def days_as_migrate_left_them() -> Iterator[None]:
    """Each test starts and ends with the days migrate makes: today and DAYS_AHEAD after."""
    yield
    with connection.cursor() as cursor:
        for status in sql.HISTORY:
            for partition in sql.day_partitions(cursor, TABLE, status):
                if not 0 <= (partition.day - today()).days <= partitions.DAYS_AHEAD:
                    cursor.execute(f"DROP TABLE {sql.q(partition.name)}")
    partitions.add_days("default")


def where_is(task: TaskRecord) -> str | None:
    """The leaf holding ``task``'s row, or None when it is gone."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT tableoid::regclass::text FROM {TABLE} WHERE id = %s", [task.pk])
        row = cursor.fetchone()
    return None if row is None else str(row[0]).strip('"')


def leaves() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT relid::text FROM pg_partition_tree(%s) WHERE isleaf", [sql.q(TABLE)])
        return {str(name).strip('"') for (name,) in cursor.fetchall()}


def add_old_days(days_back: int) -> None:
    """Give each finished status a partition for each of the last ``days_back`` days."""
    partitions.add_days("default", days_ahead=days_back, today=today() - timedelta(days_back))


def test_migrate_leaves_the_partitioned_layout() -> None:
    with connection.cursor() as cursor:
        assert sql.kind(cursor, TABLE) == "p"
        indexes = {}
        for leaf in leaves():
            cursor.execute(
                "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = "
                "to_regclass(%s) AND indisunique",
                [sql.q(leaf)],
            )
            indexes[leaf] = {str(name).strip('"') for (name,) in cursor.fetchall()}
        cursor.execute(
            "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = to_regclass(%s)",
            [sql.q(f"{TABLE}_live")],
        )
        live_indexes = " ".join(str(name) for (name,) in cursor.fetchall())
    days = {today() + timedelta(n) for n in range(partitions.DAYS_AHEAD + 1)}
    assert leaves() == {
        f"{TABLE}_live",
        *(sql.default_partition(TABLE, s) for s in sql.HISTORY),
        *(sql.day_partition(TABLE, s, d) for s in sql.HISTORY for d in days),
    }
    # Each leaf is unique on id; the dedupe index is the live leaf's alone.
    for leaf, unique in indexes.items():
        assert f"{leaf}_id" in unique, (leaf, unique)
    assert indexes[f"{TABLE}_live"] == {f"{TABLE}_live_id", "sqltasks_dedupe_live"}
    # The claim's and the rescue's indexes are the live leaf's too.
    for name in ("sqltasks_ready_idx", "sqltasks_ready_all_idx", "sqltasks_running_idx"):
        assert name in live_indexes
    call_command("makemigrations", "django_sqltasks", "--check", "--dry-run", verbosity=0)


def test_a_finished_task_moves_to_its_day_and_a_retry_moves_it_back() -> None:
    task = task_row(TaskResultStatus.RUNNING)
    assert where_is(task) == f"{TABLE}_live"
    TaskRecord.objects.filter(pk=task.pk).update(
        status=TaskResultStatus.FAILED, finished_at=timezone.now(), owner=None
    )
    assert where_is(task) == sql.day_partition(TABLE, "FAILED", today())
    assert control.retry([task], using="default") == [task]
    assert where_is(task) == f"{TABLE}_live"


def test_a_finished_task_without_a_day_lands_in_the_default_partition() -> None:
    task = task_row(TaskResultStatus.SUCCESSFUL, finished_ago=timedelta(days=400))
    assert where_is(task) == sql.default_partition(TABLE, "SUCCESSFUL")
    assert prune(using="default", successful_days=300).successful == 1
    assert where_is(task) is None


def test_prune_drops_old_days_whole_and_deletes_only_what_is_old_in_the_straddling_one() -> None:
    add_old_days(10)
    now = timezone.now()
    cutoff = now - timedelta(days=5)
    midnight = sql.day_start(cutoff.astimezone(sql.dt_timezone.utc).date())
    old = [task_row(TaskResultStatus.SUCCESSFUL, finished_ago=timedelta(days=d)) for d in (9, 7)]
    # The day of the cutoff: one task before it, one after (the same day's partition).
    before = task_row(TaskResultStatus.SUCCESSFUL, now=midnight, finished_ago=timedelta(0))
    after = task_row(TaskResultStatus.SUCCESSFUL, now=cutoff + timedelta(seconds=1))
    kept_failed = task_row(TaskResultStatus.FAILED, finished_ago=timedelta(days=9))
    recent = task_row(TaskResultStatus.SUCCESSFUL, finished_ago=timedelta(days=1))
    straddling = sql.day_partition(TABLE, "SUCCESSFUL", midnight.date())
    assert where_is(before) == where_is(after) == straddling

    pruned = prune(using="default", successful_days=5, failed_days=None, now=now)

    # The day of the cutoff waits until it is whole past it; then it is dropped.
    assert pruned.successful == 2 and where_is(before) == straddling
    assert {where_is(t) for t in old} == {None}
    with CaptureQueriesContext(connection) as queries:
        exact = prune(using="default", successful_days=5, failed_days=None, now=now, exact=True)
    assert exact.successful == 1 and where_is(before) is None
    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 1, deletes
    assert where_is(after) == straddling and where_is(recent) is not None
    assert where_is(kept_failed) == sql.day_partition(
        TABLE, "FAILED", kept_failed.finished_at.date()
    )
    # Every successful day that ended by the cutoff is gone; the failed ones are kept.
    days_left = {p.day for p in sql.day_partitions(connection.cursor(), TABLE, "SUCCESSFUL")}
    assert min(days_left) == midnight.date()
    assert pruned.partitions == (midnight.date() - (today() - timedelta(10))).days
    assert len(sql.day_partitions(connection.cursor(), TABLE, "FAILED")) > 10


def test_a_partition_holding_another_backends_tasks_is_not_dropped() -> None:
    add_old_days(3)
    mine = task_row(TaskResultStatus.SUCCESSFUL, finished_ago=timedelta(days=2))
    theirs = task_row(
        TaskResultStatus.SUCCESSFUL, finished_ago=timedelta(days=2), backend_name="other"
    )
    pruned = prune(using="default", successful_days=1, backend="default")
    assert pruned.successful == 1 and where_is(mine) is None
    assert where_is(theirs) == sql.day_partition(TABLE, "SUCCESSFUL", theirs.finished_at.date())


def test_live_tasks_survive_the_pruning_of_every_day() -> None:
    """A task READY for a year (enqueued long ago, deferred a year ahead), one RUNNING for a
    day and a workflow step parked until its turn live in the live partition, which no
    prune drops, whatever their age."""
    add_old_days(30)
    long_ago = timezone.now() - timedelta(days=400)
    deferred = task_row(
        enqueued_at=long_ago, available_at=timezone.now() + timedelta(days=365), run_after=None
    )
    running = task_row(
        TaskResultStatus.RUNNING, now=timezone.now() - timedelta(days=1), enqueued_at=long_ago
    )
    parked = task_row(available_at=timezone.now() + timedelta(days=365 * 100))
    for days in range(30):
        task_row(TaskResultStatus.SUCCESSFUL, finished_ago=timedelta(days=days))
        task_row(TaskResultStatus.FAILED, finished_ago=timedelta(days=days))

    pruned = prune(using="default", successful_days=0, failed_days=0, exact=True)

    assert pruned.total == 60 and pruned.partitions >= 60
    assert {where_is(t) for t in (deferred, running, parked)} == {f"{TABLE}_live"}
    assert TaskRecord.objects.count() == 3


def test_a_prune_racing_a_claim_and_a_finish_loses_nothing() -> None:
    """Another connection claims tasks and finishes one, uncommitted, while the prune drops
    the old days: neither waits for the other, and every task is where it should be."""
    add_old_days(5)
    for days in (4, 3, 2):
        task_row(TaskResultStatus.SUCCESSFUL, finished_ago=timedelta(days=days))
    ready = [task_row() for _ in range(5)]
    finishing = task_row(TaskResultStatus.RUNNING, owner="w2")
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN")
            claimed = dialect_for(other).claim(
                cursor, backend_name="default", queue_names=None, worker_id="w2", limit=5
            )
            cursor.execute(
                f"UPDATE {TABLE} SET status = 'SUCCESSFUL', finished_at = now(), owner = NULL "
                "WHERE id = %s AND status = 'RUNNING'",
                [finishing.pk],
            )
            with connection.cursor() as mine:  # the prune must not wait on these locks
                mine.execute("SET lock_timeout = '5s'")
            pruned = prune(using="default", successful_days=1, failed_days=1)
            cursor.execute("COMMIT")
    finally:
        other.close()
    assert pruned.successful == 3 and pruned.partitions >= 3
    assert {row.id for row in claimed} == {t.pk for t in ready}
    assert set(TaskRecord.objects.running().values_list("id", flat=True)) == {t.pk for t in ready}
    assert where_is(finishing) == sql.day_partition(TABLE, "SUCCESSFUL", today())


def run_blocked(fn: Any, blocker: Any) -> Any:
    """Run ``fn`` on a thread until it waits for a lock ``blocker`` (another connection's
    open transaction) holds, commit that transaction, and return what ``fn`` returned."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except Exception as e:
            outcome["error"] = e
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    with blocker.cursor() as cursor:
        while True:  # until the thread's statement waits on the row lock
            # pg_stat_activity is read once per transaction, and this one is open: read anew.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"
            )
            if cursor.fetchone()[0] or not thread.is_alive():
                break
        cursor.execute("COMMIT")
    thread.join(30)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@pytest.mark.parametrize("action", ["request_cancel", "cancel", "retry"])
def test_a_control_racing_a_move_is_run_again(action: str) -> None:
    """The row a control waits for moves partition as the other transaction commits (SQLSTATE
    40001 on PostgreSQL): the control runs again and finds the task in its new state."""
    status, moved_to = {
        "request_cancel": ("RUNNING", "SUCCESSFUL"),
        "cancel": ("READY", "FAILED"),
        "retry": ("FAILED", "READY"),
    }[action]
    task = task_row(status)
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(
                f"UPDATE {TABLE} SET status = %s, finished_at = CASE WHEN %s IN ('READY', "
                "'RUNNING') THEN NULL ELSE now() END WHERE id = %s",
                [moved_to, moved_to, task.pk],
            )
        if action == "cancel":
            done = run_blocked(lambda: control.cancel([task], "default", reason="x"), other)
        else:
            done = run_blocked(lambda: getattr(control, action)([task], "default"), other)
    finally:
        other.close()
    assert done == []  # the task had left the state the control acts on
    assert TaskRecord.objects.get(pk=task.pk).status == moved_to


def test_adding_days_is_idempotent_and_one_worker_at_a_time() -> None:
    assert partitions.add_days("default") == 0  # migrate made them
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN")
            assert sql.try_upkeep_lock(cursor)
            later = today() + timedelta(days=partitions.DAYS_AHEAD + 1)
            # Another worker holds the lock: this one passes, adding nothing.
            assert partitions.add_days("default", today=later) == 0
            cursor.execute("COMMIT")
    finally:
        other.close()
    assert partitions.add_days("default", days_ahead=0, today=later) == 2


def test_tasks_partition_converts_a_plain_table_with_its_tasks(monkeypatch: Any) -> None:
    """A table made by migrations before the partitioned layout, holding live and finished
    tasks, is converted by the command (migrate refuses a table this big, naming the command);
    every task is kept, in its partition."""
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {sql.q(TABLE)} CASCADE")
    # The plain table a CreateModel of today's model makes (every column of later migrations).
    with connection.schema_editor() as editor:
        editor.create_model(TaskRecord)
    ready = task_row(dedupe_key="k")
    finished = task_row(TaskResultStatus.SUCCESSFUL, finished_ago=timedelta(days=3))
    failed = task_row(TaskResultStatus.FAILED, finished_ago=timedelta(days=100))
    with connection.cursor() as cursor:
        assert sql.kind(cursor, TABLE) == "r"
    monkeypatch.setattr(partitions, "MIGRATE_MAX_ROWS", 2)
    with pytest.raises(RuntimeError, match="holds more than 2 tasks: convert it online first"):
        partitions.convert_at_migrate(connection)

    call_command("tasks_partition", "--batch-size", "1", verbosity=0)
    partitions.convert_at_migrate(connection)  # then migrate finds it done

    assert where_is(ready) == f"{TABLE}_live"
    assert where_is(finished) == sql.day_partition(TABLE, "SUCCESSFUL", finished.finished_at.date())
    assert where_is(failed) == sql.default_partition(TABLE, "FAILED")  # older than 62 days
    with connection.cursor() as cursor:
        assert not sql.exists(cursor, TABLE + sql.OLD)
        assert {i.name for i in sql.indexes_of(cursor, f"{TABLE}_live")} >= {"sqltasks_dedupe_live"}
    assert partitions.conversion_state(connection) == "partitioned"


def test_the_steps_of_a_dropped_days_tasks_go_with_them() -> None:
    """A dropped day takes its tasks without their ids: the steps of those tasks go too, and
    the steps of a task enqueued as long ago that still lives (asleep) stay."""
    add_old_days(10)
    now = timezone.now()
    gone = task_row(
        TaskResultStatus.SUCCESSFUL,
        finished_ago=timedelta(days=7),
        id=first_id_at(now - timedelta(days=8)),
    )
    asleep = task_row(
        id=uuid.UUID(int=first_id_at(now - timedelta(days=9)).int + 1),
        available_at=now + timedelta(days=3),
    )
    for task in (gone, asleep):
        StepRecord.objects.create(task_id=task.pk, kind="step", name="charge", state="done")

    pruned = prune(using="default", successful_days=5, failed_days=None, now=now)

    assert pruned.partitions >= 1 and where_is(gone) is None
    assert list(StepRecord.objects.values_list("task_id", flat=True)) == [asleep.pk]


def test_the_live_partition_has_a_queues_autovacuum_settings() -> None:
    """The live tasks' partition is vacuumed and analyzed by a count of dead versions, not by
    a share of its few live rows, at full speed (sql/partitions.py, LIVE_STORAGE)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT option_name, option_value FROM pg_class, pg_options_to_table(reloptions) "
            "WHERE oid = to_regclass(%s)",
            [sql.q(sql.live(TABLE))],
        )
        options = dict(cursor.fetchall())
    assert options == {
        name.strip(): value.strip()
        for name, value in (item.split("=") for item in sql.LIVE_STORAGE.split(","))
    }
    assert options["autovacuum_vacuum_cost_delay"] == "0"
    assert options["autovacuum_vacuum_scale_factor"] == "0"


def test_a_day_is_attached_beside_a_full_default_partition_without_scanning_it_locked() -> None:
    """Old tasks in the default partition (a day without a partition of its own): a day whose
    tasks are there is not tried (an attach would scan it all, then fail), and another is
    attached with the default partition checked beforehand by a constraint, left no more."""
    stray = task_row(TaskResultStatus.SUCCESSFUL, finished_ago=timedelta(days=400))
    default = sql.default_partition(TABLE, "SUCCESSFUL")
    assert where_is(stray) == default
    stray_day = stray.finished_at.astimezone(sql.dt_timezone.utc).date()
    with connection.cursor() as cursor:
        assert sql.default_rows(cursor, TABLE, "SUCCESSFUL", stray_day) == (True, True)
    # Its own day cannot be added: its task is in the default partition.
    assert partitions.add_days("default", days_ahead=0, today=stray_day) == 1  # FAILED's only
    with connection.cursor() as cursor:
        days = {p.day for p in sql.day_partitions(cursor, TABLE, "SUCCESSFUL")}
        assert stray_day not in days
        # A day of none of them is attached beside it.
        later = stray_day + timedelta(days=1)
        assert sql.default_rows(cursor, TABLE, "SUCCESSFUL", later) == (True, False)
    assert partitions.add_days("default", days_ahead=0, today=later) == 2
    with connection.cursor() as cursor:
        assert later in {p.day for p in sql.day_partitions(cursor, TABLE, "SUCCESSFUL")}
        cursor.execute(
            "SELECT count(*) FROM pg_constraint WHERE conrelid = to_regclass(%s) "
            "AND conname LIKE 'sqltasks_not_%%'",
            [sql.q(default)],
        )
        assert cursor.fetchone()[0] == 0
    assert where_is(stray) == default
