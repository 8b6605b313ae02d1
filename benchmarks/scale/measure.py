"""What the ``scale`` profile times beside the history: the admin's pages, the claim, a day's
prune, the enqueue with and without the search indexes; and the table's size."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, RequestFactory
from django.utils import timezone

from django_sqltasks.models import TaskRecord
from django_sqltasks.sql import dialect_for

WARM = 1  # requests before the timed ones
TIMED = 3  # timed requests per page; the median is reported
CLAIMS = 100  # claims timed, each of CLAIM_BATCH tasks
WARM_CLAIMS = 10  # claims before the timed ones
CLAIM_BATCH = 10
NOOP = "benchmarks.scale.tasks.noop"  # declared; stored only while the enqueue is timed
ENQUEUES = 2000  # enqueues timed, with and without the search indexes
# The indexes of the task table that serve the claim, the rescue, pruning and subjects: every
# other (non-unique) index of the table is taken for a search index.
CORE_INDEXES = frozenset(
    {
        "sqltasks_ready_idx",
        "sqltasks_ready_all_idx",
        "sqltasks_ready_limited_idx",
        "sqltasks_ready_limited_at_idx",
        "sqltasks_running_idx",
        "sqltasks_finished_idx",
        "sqltasks_subject_idx",
    }
)


@dataclass
class Page:
    label: str
    url: str
    ms: float | None = None  # median server-side time
    status: int | None = None
    found: bool | None = None  # searches: whether the row looked for is on the page
    note: str = ""


@dataclass
class Results:
    pages: list[Page] = field(default_factory=list)
    claim_empty_ms: float | None = None
    claim_full_ms: float | None = None
    prune: dict[str, Any] = field(default_factory=dict)
    enqueue: dict[str, Any] = field(default_factory=dict)


def timed(fn: Callable[[], Any], warm: int = WARM, times: int = TIMED) -> tuple[float, Any]:
    """Call ``fn`` ``warm`` times, then ``times`` times timed: the median in ms, the last result."""
    result = None
    for _ in range(warm):
        result = fn()
    samples = []
    for _ in range(times):
        start = time.perf_counter()
        result = fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples), result


# The claim ------------------------------------------------------------------------------------


def claim_ms() -> float:
    """The median time of a claim of CLAIM_BATCH tasks among CLAIMS * CLAIM_BATCH due ones."""
    now = timezone.now()
    TaskRecord.objects.bulk_create(
        [
            TaskRecord(
                task_path="benchmarks.scale.tasks.noop",
                backend_name="default",
                queue_name="default",
                enqueued_at=now,
                available_at=now - timedelta(seconds=1),
                args=[f"claim{i}@example.com", i],
            )
            for i in range((WARM_CLAIMS + CLAIMS) * CLAIM_BATCH)
        ],
        batch_size=500,
    )
    analyze()
    dialect = dialect_for(connection)
    samples = []
    with connection.cursor() as cursor:
        for n in range(WARM_CLAIMS + CLAIMS):
            start = time.perf_counter()
            rows = dialect.claim(
                cursor,
                backend_name="default",
                queue_names=["default"],
                worker_id="scale-bench",
                limit=CLAIM_BATCH,
            )
            if n >= WARM_CLAIMS:
                samples.append((time.perf_counter() - start) * 1000)
            assert rows, "the claim found no due task"
    TaskRecord.objects.filter(owner="scale-bench").delete()
    return statistics.median(samples)


# The admin ------------------------------------------------------------------------------------


def admin_pages(total: int, middle: TaskRecord, address: str, tag: str | None) -> list[Page]:
    """Each admin page of the app's models, the task list's filters, deep pages and searches."""
    user = User.objects.filter(username="scale").first() or User.objects.create_superuser(
        "scale", "scale@example.com", "pw"
    )
    client = Client()
    client.force_login(user)
    pages: list[Page] = []
    registry = sorted(admin.site._registry.items(), key=lambda item: item[0] is not TaskRecord)
    for model, model_admin in registry:
        if model._meta.app_label != "django_sqltasks":
            continue
        base = f"/admin/django_sqltasks/{model._meta.model_name}/"
        pages.append(Page(f"{model._meta.verbose_name_plural} (list)", base))
        if model is TaskRecord:
            pages.extend(task_pages(base, model_admin, user, total, middle, address, tag))
    for page in pages:
        if page.note:
            continue
        page.ms, response = timed(lambda url=page.url: client.get(url))
        page.status = response.status_code
        if page.found is not None:
            page.found = f"/{middle.pk}/change/" in response.content.decode() or (
                page.label.startswith(("search: error class", "search: tag"))
                and re.search(r"/taskrecord/[0-9a-f-]{36}/change/", response.content.decode())
                is not None
            )
    return pages


def task_pages(
    base: str,
    model_admin: Any,
    user: User,
    total: int,
    middle: TaskRecord,
    address: str,
    tag: str | None,
) -> list[Page]:
    request = RequestFactory().get(base)
    request.user = user
    changelist = model_admin.get_changelist_instance(request)
    pages = []
    for spec in changelist.filter_specs:
        choices = [c for c in spec.choices(changelist) if not c.get("selected")]
        if choices:
            choice = choices[-1]
            pages.append(
                Page(f"filter: {spec.title} = {choice['display']}", base + choice["query_string"])
            )
    # A task and a queue with no stored task (a job not run this month, a queue never used):
    # the filter finds that none match without reading the history.
    pages.append(Page("filter: task with none stored (noop)", f"{base}?task_path={NOOP}"))
    pages.append(Page("filter: queue with none stored (idle)", f"{base}?queue_name=idle"))
    for number in (40, 500):
        if (number - 1) * model_admin.list_per_page >= total:
            continue  # past the last page: the admin redirects
        pages.append(Page(f"deep page ?p={number}", f"{base}?p={number}"))
    pages.append(Page("search: id", f"{base}?q={middle.pk}", found=False))
    pages.append(Page("search: argument value (an e-mail)", f"{base}?q={address}", found=False))
    # An error's class path, as a traceback shows it.
    error = "shop.errors.PaymentDeclined"
    pages.append(Page("search: error class", f"{base}?q={error}", found=False))
    if tag is None:
        pages.append(Page("search: tag", base, note="no tags column: cannot measure"))
    else:
        pages.append(Page("search: tag", f"{base}?q={tag}", found=False))
    pages.append(Page("a task's page", f"{base}{middle.pk}/change/"))
    return pages


# Pruning and size -----------------------------------------------------------------------------


def table_bytes() -> int | None:
    """The task table's size on disk with its indexes (and its partitions'), if known."""
    table = TaskRecord._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # A plain table is no partition tree: then its own size.
            cursor.execute(
                "SELECT COALESCE((SELECT SUM(pg_total_relation_size(relid)) "
                "FROM pg_partition_tree(%s::regclass)), pg_total_relation_size(%s::regclass))",
                [table, table],
            )
            return int(cursor.fetchone()[0])
        if connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {table}")
            cursor.fetchall()
            cursor.execute(
                "SELECT data_length + index_length FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name = %s",
                [table],
            )
            return int(cursor.fetchone()[0])
        cursor.execute("PRAGMA page_count")
        pages = int(cursor.fetchone()[0])
        cursor.execute("PRAGMA freelist_count")
        free = int(cursor.fetchone()[0])
        cursor.execute("PRAGMA page_size")
        return (pages - free) * int(cursor.fetchone()[0])  # the whole file: SQLite has no split


def wal_lsn() -> str | None:
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn()::text")
        return str(cursor.fetchone()[0])


def wal_bytes(since: str | None) -> int | None:
    if since is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", [since])
        return int(cursor.fetchone()[0])


def prune_a_day(now: datetime, days: float) -> dict[str, Any]:
    """Prune what finished over ``days`` before ``now``: the oldest day of the history."""
    from django_sqltasks.store.pruning import prune  # after setup: it imports the models

    before = table_bytes()
    lsn = wal_lsn()
    start = time.perf_counter()
    pruned = prune(using="default", successful_days=days, failed_days=days, now=now)
    seconds = time.perf_counter() - start
    wal = wal_bytes(lsn)
    return {
        "rows": pruned.total,
        "seconds": round(seconds, 3),
        "wal_bytes": wal,
        "bytes_before": before,
        "bytes_after": table_bytes(),
    }


# The enqueue ----------------------------------------------------------------------------------


def enqueue_rate() -> float:
    """Sync enqueues per second, one autocommit INSERT each, as a view makes them."""
    from benchmarks.scale.tasks import noop  # after setup: declaring a task loads the backend

    noop.enqueue("warm@example.com", 0)
    start = time.perf_counter()
    for i in range(ENQUEUES):
        noop.enqueue(f"user{i}@example.com", i)
    rate = ENQUEUES / (time.perf_counter() - start)
    TaskRecord.objects.filter(task_path="benchmarks.scale.tasks.noop", status="READY").delete()
    return rate


def search_indexes() -> dict[str, str]:
    """The task table's search indexes (those outside CORE_INDEXES), by name, with what recreates
    each (its definition where the database gives one)."""
    table = TaskRecord._meta.db_table
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
        names = {
            name
            for name, info in found.items()
            if info["index"]
            and not info["unique"]
            and not info["primary_key"]
            and name not in CORE_INDEXES
            and not info.get("foreign_key")
        }
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table]
            )
            # A partitioned table's index reads "ON ONLY": recreated so, it would have no leaves.
            return {
                n: d.replace(" ON ONLY ", " ON ", 1) for n, d in cursor.fetchall() if n in names
            }
        if connection.vendor == "sqlite":
            cursor.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = %s",
                [table],
            )
            return {n: d for n, d in cursor.fetchall() if n in names and d}
    declared = {index.name: index for index in TaskRecord._meta.indexes}
    return {name: "model" for name in names if name in declared}


def enqueue_with_and_without_search_indexes(rebuild: bool = True) -> dict[str, Any]:
    """Enqueues per second with the table as migrated, then with its search indexes dropped
    (built again after, with ``rebuild``)."""
    indexes = search_indexes()
    result: dict[str, Any] = {"with": round(enqueue_rate(), 1), "search_indexes": sorted(indexes)}
    if not indexes:
        result["without"] = None
        result["note"] = "no search index on this schema: cannot measure the difference"
        return result
    table = connection.ops.quote_name(TaskRecord._meta.db_table)
    declared = {index.name: index for index in TaskRecord._meta.indexes}
    with connection.cursor() as cursor:
        for name in indexes:
            if connection.vendor == "mysql":
                cursor.execute(f"DROP INDEX {connection.ops.quote_name(name)} ON {table}")
            else:
                cursor.execute(f"DROP INDEX {connection.ops.quote_name(name)}")
    try:
        result["without"] = round(enqueue_rate(), 1)
    finally:
        if rebuild:
            rebuild_indexes(indexes, declared)
    return result


def rebuild_indexes(indexes: dict[str, str], declared: dict[str, Any]) -> None:
    """Build again the search indexes ``enqueue_with_and_without_search_indexes`` dropped."""
    with connection.cursor() as cursor:
        for name, definition in indexes.items():
            if definition == "model":
                with connection.schema_editor() as editor:
                    editor.add_index(TaskRecord, declared[name])
            else:
                cursor.execute(definition)
    # A new expression index has no statistics until ANALYZE (which autovacuum does not run
    # for a new index): without them PostgreSQL's planner guessed that 1% of 48M tasks match
    # a search, and read the primary key newest first instead of the index (a search took
    # over 30 s, against 256 ms before the rebuild).
    analyze()


# Upkeep ---------------------------------------------------------------------------------------


def analyze(vacuum: bool = False) -> None:
    """Bring the planner's statistics up to date (and, with ``vacuum``, PostgreSQL's visibility
    map, as autovacuum would have after a bulk load)."""
    table = TaskRecord._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"{'VACUUM ' if vacuum else ''}ANALYZE {table}")
        elif connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {table}")
            cursor.fetchall()
        else:
            cursor.execute("ANALYZE")


def middle_row(total: int) -> TaskRecord:
    """A task from the middle of the history (a FAILED one, with a subject, on every schema)."""
    ids = TaskRecord.objects.order_by("-pk").values_list("pk", flat=True)
    pk = ids[min(total // 2, max(total - 1, 0))]
    return TaskRecord.objects.get(pk=pk)
