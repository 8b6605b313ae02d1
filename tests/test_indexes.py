"""Every index serves a named query; the planner must use it with thousands of rows present."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.db.backends.utils import CursorWrapper
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import PausedQueue, TaskRecord
from django_sqltasks.sql import Scope, dialect_for
from django_sqltasks.sql.rows import Outcome
from tests.factories import held_snapshot, insert_rows, plan_uses, worker_lease

# ANALYZE TABLE commits implicitly on MySQL: flush the table after each test instead of
# relying on a rolled-back transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def analyze() -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"ANALYZE {TaskRecord._meta.db_table}")
        elif connection.vendor == "sqlite":
            cursor.execute("ANALYZE")
        else:
            cursor.execute(f"ANALYZE TABLE {TaskRecord._meta.db_table}")
            cursor.fetchall()


def fill(ready: int, finished: int) -> None:
    now = timezone.now()
    queues = ("default", "other", "slow")

    def rows(status: str, count: int, step: timedelta, **fields: object) -> None:
        """``count`` rows of ``status`` across the queues and priorities, each ``step`` older."""
        template = TaskRecord(
            task_path="tests.tasks.noop", backend_name="default", status=status, **fields
        )
        insert_rows(
            template,
            count,
            lambda i: {
                "queue_name": queues[i % 3],
                "priority": i % 7 - 3,
                "enqueued_at": now - step * i,
                "available_at": now - step * i,
            },
        )

    rows(TaskResultStatus.SUCCESSFUL, finished, timedelta(minutes=1), finished_at=now)
    rows(TaskResultStatus.READY, ready, timedelta(seconds=1))
    analyze()


def explain(sql: str, params: list[object]) -> str:
    prefix = {"postgresql": "EXPLAIN", "sqlite": "EXPLAIN QUERY PLAN", "mysql": "EXPLAIN"}
    with connection.cursor() as cursor:
        cursor.execute(f"{prefix[connection.vendor]} {sql}", params)
        return "\n".join(" ".join(str(col) for col in row) for row in cursor.fetchall())


@pytest.mark.large_table
@pytest.mark.parametrize("queue_names", [["default"], ["default", "other"], None])
def test_claim_uses_the_ready_index(queue_names: list[str] | None) -> None:
    fill(ready=300, finished=10_000)
    sql, params = dialect_for(connection).claim_sql(
        backend_name="default",
        queue_names=queue_names,
        worker_id="w",
        limit=50,
    )
    plan = explain(sql, params)
    # One queue: the per-queue index; several or all: the one that keeps the order.
    expected = "sqltasks_ready_idx" if queue_names == ["default"] else "sqltasks_ready_all_idx"
    assert plan_uses(plan, expected), plan


@pytest.mark.large_table
@pytest.mark.parametrize("queue_names", [["default"], None])
def test_the_claim_reads_due_rows_in_order_without_sorting_them(
    queue_names: list[str] | None,
) -> None:
    """With many due rows and a paused queue, the claim still walks its index in order and
    stops at its limit: the paused-queue check must not turn it into a sort of every due row
    (it did, as an anti-join: 610 ms a claim beside 1,000,000 due tasks)."""
    PausedQueue.objects.create(backend_name="default", queue_name="slow")
    fill(ready=20_000, finished=0)
    plan = explain(
        *dialect_for(connection).claim_sql(
            backend_name="default", queue_names=queue_names, worker_id="w", limit=50
        )
    )
    sorted_all = {"postgresql": "Sort", "sqlite": "TEMP B-TREE", "mysql": "filesort"}
    if connection.vendor == "postgresql":
        # What the claim took comes back in claim order: a sort of its batch (at most its
        # limit of rows), after the picking, which must not sort.
        plan = plan[: plan.index("CTE claimed")]
    assert sorted_all[connection.vendor] not in plan, plan


@pytest.mark.large_table
@pytest.mark.parametrize("priority", [None, 0])
def test_a_claim_beside_rows_never_analyzed_finds_them_by_their_ids(priority: int | None) -> None:
    """PostgreSQL: right after a burst into a table without statistics (emptied by TRUNCATE,
    and not analyzed since), the claim's UPDATE must still find the picked rows directly (by
    their addresses, or by the primary key). As a join, the planner took the table for a few
    rows and joined each picked id against a scan of it: 84 ms a claim of 200 beside 5,000
    ready rows, against 3 ms."""
    if connection.vendor != "postgresql":
        pytest.skip("the plan of PostgreSQL's claim statement")
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TaskRecord._meta.db_table}")
    now = timezone.now()
    template = TaskRecord(
        task_path="tests.tasks.noop",
        backend_name="default",
        status=TaskResultStatus.READY,
        queue_name="default",
        priority=0,
    )
    insert_rows(template, 5_000, lambda i: {"enqueued_at": now, "available_at": now})
    sql, params = dialect_for(connection).claim_sql(
        backend_name="default",
        queue_names=None,
        worker_id="w",
        limit=200,
        scope=Scope(priority=priority),
    )
    plan = explain(sql, params)
    # Picking may scan: without statistics the planner cannot know an index pays, and one
    # pass over the ready rows is bounded. What must never happen is a scan per picked id.
    update = plan[plan.index("CTE claimed") :]
    assert "Seq Scan" not in update, plan
    assert "Nested Loop" not in update, plan
    # The main claim finds them by their row versions' addresses (a TID scan), the fair
    # claim's by their ids (the primary key).
    assert ("(ctid = ANY" if priority is None else "(id = ANY") in update, plan


@pytest.mark.large_table
def test_rescue_uses_the_running_index() -> None:
    fill(ready=500, finished=8_000)
    TaskRecord.objects.filter(
        id__in=list(TaskRecord.objects.ready().values_list("id", flat=True)[:20])
    ).update(status=TaskResultStatus.RUNNING, owner="gone")
    table = TaskRecord._meta.db_table
    plan = explain(f"SELECT id FROM {table} WHERE status = 'RUNNING' AND owner = %s", ["gone"])
    assert plan_uses(plan, "sqltasks_running_idx"), plan


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_an_outcome_finds_its_task_by_id_not_among_its_owners_running_tasks() -> None:
    # An outcome's write is guarded by the owner; it must still find its row by id. The
    # RUNNING entries of sqltasks_running_idx look few to the planner (as many as the workers
    # run at once), but a held snapshot leaves a dead one there for every task claimed since.
    fill(ready=2_000, finished=0)
    running = list(TaskRecord.objects.ready().values_list("id", flat=True)[:8])
    TaskRecord.objects.filter(id__in=running).update(
        status=TaskResultStatus.RUNNING, owner="busy", attempts=1
    )
    analyze()
    outcome = Outcome(
        id=running[0], status="SUCCESSFUL", finished_at=timezone.now(), return_value="1"
    )
    with CaptureQueriesContext(connection) as queries, connection.cursor() as cursor:
        written = dialect_for(connection).complete(cursor, "busy", [outcome])
    assert written == {running[0]}
    plans = {"custom": explain(queries.captured_queries[-1]["sql"], [])}
    # A prepared statement's generic plan (OPTIONS prepare_threshold): it guesses the number
    # of ids and of RUNNING rows instead of reading them.
    recorder = Recorder()
    dialect_for(connection).complete(recorder, "busy", [outcome])
    numbers = iter(range(1, 100))
    generic = re.sub(r"%s", lambda _: f"${next(numbers)}", recorder.sql)
    with connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE an_outcome AS {generic}")
        try:
            cursor.execute("EXPLAIN EXECUTE an_outcome(%s, %s, %s)", recorder.params)
            plans["generic"] = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE an_outcome")
            cursor.execute("RESET plan_cache_mode")
    for plan in plans.values():
        assert "sqltasks_running_idx" not in plan, plan
        assert plan_uses(plan, f"{TaskRecord._meta.db_table}_pkey"), plan


class Recorder:
    """A cursor that keeps the statement it is given instead of running it."""

    sql = ""
    params: list[object] = []
    cursor = None  # no driver cursor: the statement is not prepared

    def execute(self, sql: str, params: list[object]) -> None:
        self.sql, self.params = sql, params

    def fetchall(self) -> list[object]:
        return []


def add_ready(*rows: tuple[str, int, int], limit_key: str | None = None) -> list[TaskRecord]:
    """READY tasks of (queue, priority, seconds from now until due): negative means due."""
    now = timezone.now()
    return TaskRecord.objects.bulk_create(
        [
            TaskRecord(
                task_path="tests.tasks.noop",
                backend_name="default",
                queue_name=queue,
                priority=priority,
                enqueued_at=now,
                available_at=now + timedelta(seconds=seconds),
                limit_key=limit_key,
            )
            for queue, priority, seconds in rows
        ],
        batch_size=500,
    )


@pytest.mark.parametrize(
    ("queue_names", "limit_key"),
    [(["default"], None), (["default", "other"], None), (None, None), (None, "key")],
)
@pytest.mark.parametrize("limit", [1, 2, 5, 50])
def test_the_claim_takes_due_tasks_by_priority_past_deferred_ones(
    queue_names: list[str] | None, limit_key: str | None, limit: int
) -> None:
    """Priorities whose tasks are all deferred, or partly, sit above and between the due
    ones; a batch may end inside a priority or span several. Paused queues are skipped."""
    PausedQueue.objects.create(backend_name="default", queue_name="slow")
    hour = 3600
    rows = add_ready(
        ("default", 100, hour),
        ("other", 100, hour),
        ("default", 10, -3),
        ("default", 10, hour),
        ("other", 10, -2),
        ("default", 10, 2 * hour),
        ("slow", 10, -9),
        ("default", 0, hour),
        ("other", 0, hour),
        ("default", -5, -1),
        ("other", -5, -8),
        ("default", -5, -7),
        ("slow", -5, -9),
        ("default", -5, hour),
        ("other", -100, -1),
        ("default", -100, -2),
        ("default", -100, hour),
        limit_key=limit_key,
    )
    add_ready(("default", 50, -1), limit_key=None if limit_key else "key")  # not in scope
    analyze()
    queues = queue_names or ["default", "other"]
    expected = [
        r.id
        for r in sorted(rows, key=lambda r: (-r.priority, r.available_at))
        if r.available_at <= timezone.now() and r.queue_name in queues
    ]
    dialect = dialect_for(connection)
    claimed: list[object] = []
    with connection.cursor() as cursor:
        while batch := dialect.claim(
            cursor,
            backend_name="default",
            queue_names=queue_names,
            worker_id="w",
            limit=limit,
            scope=Scope(limit_key=limit_key),
        ):
            assert len(batch) <= limit
            claimed.extend(sorted((r.id for r in batch), key=expected.index))
    assert claimed == expected


@pytest.mark.parametrize("limit", [7, 100])
def test_a_claim_takes_due_tasks_across_many_priorities(limit: int) -> None:
    """Thirty priorities with a due task and a deferred one each, among the 201 allowed: a
    batch spans more of them than MariaDB's claim reads in one SELECT (20)."""
    rows = add_ready(*[("default", p, s) for p in range(100, -101, -7) for s in (-1, 3600)])
    analyze()
    expected = [
        r.id for r in sorted(rows, key=lambda r: -r.priority) if r.available_at <= timezone.now()
    ]
    dialect = dialect_for(connection)
    claimed: list[object] = []
    with connection.cursor() as cursor:
        while batch := dialect.claim(
            cursor, backend_name="default", queue_names=None, worker_id="w", limit=limit
        ):
            assert len(batch) <= limit
            claimed.extend(sorted((r.id for r in batch), key=expected.index))
    assert claimed == expected


def claim_reads(queue_names: list[str] | None) -> int:
    """How much of the database one claim of 10 tasks reads, as each database counts it:
    the buffers of the ready indexes' scans in the plan of the claim as run (PostgreSQL),
    virtual machine steps in hundreds (SQLite), index entries read (MariaDB)."""
    dialect = dialect_for(connection)

    def claim(cursor: CursorWrapper) -> None:
        dialect.claim(
            cursor, backend_name="default", queue_names=queue_names, worker_id="w", limit=10
        )

    if connection.vendor == "postgresql":
        sql, params = dialect.claim_sql(
            backend_name="default", queue_names=queue_names, worker_id="w", limit=10
        )
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params)
            document = cursor.fetchone()[0]
        plan = json.loads(document) if isinstance(document, str) else document
        buffers, nodes = 0, [plan[0]["Plan"]]
        while nodes:
            node = nodes.pop()
            nodes.extend(node.get("Plans", []))
            if str(node.get("Index Name", "")).startswith("sqltasks_ready"):
                buffers += node["Shared Hit Blocks"] + node["Shared Read Blocks"]
        return buffers
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            steps = [0]

            def count() -> int:
                steps[0] += 1
                return 0  # go on

            connection.connection.set_progress_handler(count, 100)
            try:
                claim(cursor)
            finally:
                connection.connection.set_progress_handler(None, 100)
            return steps[0]
        reads = (
            "SHOW SESSION STATUS WHERE Variable_name IN "
            "('Handler_read_key', 'Handler_read_next', 'Handler_read_prev')"
        )
        cursor.execute(reads)
        before = sum(int(value) for _, value in cursor.fetchall())
        claim(cursor)
        cursor.execute(reads)
        return sum(int(value) for _, value in cursor.fetchall()) - before


@pytest.mark.large_table
@pytest.mark.parametrize("queue_names", [["default"], None])
def test_the_claim_does_not_read_deferred_tasks_of_a_higher_priority(
    queue_names: list[str] | None,
) -> None:
    """Tasks not yet due cost a claim nothing, whatever their priority: beside 10,000
    priority-10 tasks due in a year, a claim of due priority-0 tasks reads about what it
    reads without them. It read every one of them: 1-6 ms a claim per 1,000,000 on
    PostgreSQL, 4 s on MariaDB."""
    add_ready(*[("default", 0, -i) for i in range(1, 101)])
    analyze()
    alone = claim_reads(queue_names)
    now = timezone.now()
    insert_rows(
        TaskRecord(task_path="tests.tasks.noop", backend_name="default", priority=10),
        10_000,
        lambda i: {"available_at": now + timedelta(days=365, seconds=i)},
    )
    analyze()
    beside = claim_reads(queue_names)
    assert beside <= 2 * alone + 20, (alone, beside)


@pytest.mark.large_table
def test_the_look_for_limited_suspects_reads_their_marks_range() -> None:
    """Suspects under a limit are few, but their keys may be many (100,000 fair keys): the
    look every worker makes at each heartbeat read every READY limited task (226 ms at
    100,000 on PostgreSQL); it reads the marks' range of sqltasks_ready_limited_at_idx."""
    now = timezone.now()
    template = TaskRecord(task_path="tests.tasks.noop", backend_name="default", limit_key="k")
    insert_rows(
        template,
        5_000,
        lambda i: {
            "limit_key": f"fair:tests.tasks.noop#k{i}",
            "enqueued_at": now - timedelta(seconds=i),
            "available_at": now - timedelta(seconds=i),
        },
    )
    analyze()
    sql, params = dialect_for(connection)._suspects_sql("default", None, 8, limited=True)
    plan = explain(sql, params)
    assert plan_uses(plan, "sqltasks_ready_limited_at_idx"), plan


@pytest.mark.large_table
def test_recent_finished_tasks_are_read_through_the_finished_index() -> None:
    """The overview's counts of the last hour, the throughput chart and pruning read finished
    tasks by time: on SQLite, the partial index applies only if the statuses are literals."""
    now = timezone.now()
    template = TaskRecord(
        task_path="tests.tasks.noop", backend_name="default", status=TaskResultStatus.SUCCESSFUL
    )
    insert_rows(template, 3000, lambda i: {"finished_at": now - timedelta(minutes=i)})
    analyze()
    recent = TaskRecord.objects.finished().filter(finished_at__gt=now - timedelta(minutes=59.5))
    assert recent.count() == 60
    sql, params = recent.order_by().values("queue_name").query.sql_with_params()
    assert "%s" not in sql.split("finished_at")[0], sql  # the statuses are not parameters
    if connection.vendor == "sqlite":
        plan = explain(sql, list(params))
        assert plan_uses(plan, "sqltasks_finished_idx"), plan


@pytest.mark.skipif("connection.vendor != 'postgresql'")
@pytest.mark.large_table
def test_a_workers_look_for_cancel_requests_reads_only_the_tasks_asked_to_stop() -> None:
    """At every heartbeat a worker reads its RUNNING tasks whose cancellation was asked. Beside
    a held snapshot the running index keeps a dead entry for every task the worker claimed and
    finished since (none removable); the cancel-request index holds only the few asked."""
    fill(ready=6_000, finished=0)
    ids = list(TaskRecord.objects.ready().values_list("id", flat=True))
    with held_snapshot():
        done = ids[:-2]
        for start in range(0, len(done), 500):
            rows = TaskRecord.objects.filter(id__in=done[start : start + 500])
            rows.update(status=TaskResultStatus.RUNNING, owner="busy", attempts=1)
            rows.update(status=TaskResultStatus.SUCCESSFUL, owner=None, finished_at=timezone.now())
        TaskRecord.objects.filter(id__in=ids[-2:]).update(
            status=TaskResultStatus.RUNNING, owner="busy", attempts=1
        )
        TaskRecord.objects.filter(id=ids[-1]).update(cancel_requested=True)
        analyze()
        lease = worker_lease("busy")
        with CaptureQueriesContext(connection) as queries:
            assert lease.cancel_requests() == [ids[-1]]
        plan = explain_analyze(queries.captured_queries[-1]["sql"], [])
        running = explain_analyze(
            f"SELECT id FROM {TaskRecord._meta.db_table} WHERE status = 'RUNNING' AND owner = %s",
            ["busy"],
        )
    assert plan_uses(plan, "sqltasks_cancel_requested_idx"), plan
    # What the running index's walk reads (its 5,998 dead entries and their heap pages), and
    # what the look for cancel requests reads: a few index pages and the one row.
    assert plan_uses(running, "sqltasks_running_idx"), running
    assert buffers(running) > 100 and buffers(plan) * 10 < buffers(running), (plan, running)


def explain_analyze(sql: str, params: list[object]) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def buffers(plan: str) -> int:
    """The buffers a plan's top node read (hit or not), from EXPLAIN (ANALYZE, BUFFERS)."""
    found = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", plan)
    assert found, plan
    return int(found.group(1)) + int(found.group(2) or 0)


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_every_gin_index_of_the_task_table_merges_a_small_pending_list() -> None:
    """The search indexes (GIN) in every leaf, the live tasks' and each day's: with the
    default 4 MB pending list, the statement that passed it paid for the whole merge."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, c.reloptions FROM pg_class c JOIN pg_am a ON a.oid = c.relam "
            "JOIN pg_index i ON i.indexrelid = c.oid JOIN pg_class r ON r.oid = i.indrelid "
            "WHERE a.amname = 'gin' AND r.relname LIKE %s",
            [TaskRecord._meta.db_table + "%"],
        )
        found = dict(cursor.fetchall())
    leaves = {name for name in found if "_live_" in name}
    assert leaves and len(found) > 4, found
    assert all(options == ["gin_pending_list_limit=64"] for options in found.values()), found
