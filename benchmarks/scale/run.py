"""The ``scale`` profile's steps, in order, and its table (Django is set up before this module is
imported)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.db import DatabaseError, connection
from django.utils import timezone

from benchmarks.scale import fill, measure
from django_sqltasks.models import TaskRecord


def ensure_database() -> None:
    """Create the database on its server if it is missing (a SQLite file is made on connect)."""
    if connection.vendor == "sqlite":
        return
    name = connection.ops.quote_name(connection.settings_dict["NAME"])
    with connection._nodb_cursor() as cursor, contextlib.suppress(DatabaseError):  # it exists
        cursor.execute(f"CREATE DATABASE {name}")


def drop_database() -> None:
    """Drop the database (delete the SQLite file)."""
    settings = connection.settings_dict
    connection.close()
    if connection.vendor == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path(str(settings["NAME"]) + suffix).unlink(missing_ok=True)
        return
    with connection._nodb_cursor() as cursor:
        cursor.execute(f"DROP DATABASE {connection.ops.quote_name(settings['NAME'])}")


def empty_tables() -> None:
    table = connection.ops.quote_name(TaskRecord._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {table}" if connection.vendor == "sqlite" else f"TRUNCATE TABLE {table}"
        )


def server_version() -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT sqlite_version()")
            return f"SQLite {cursor.fetchone()[0]}"
        cursor.execute("SELECT version()")
        version = str(cursor.fetchone()[0])
    return version.split(" on ")[0] if connection.vendor == "postgresql" else f"MariaDB {version}"


def partitioned() -> bool:
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relkind = 'p' FROM pg_class WHERE oid = %s::regclass",
            [TaskRecord._meta.db_table],
        )
        return bool(cursor.fetchone()[0])


def add_partitions(start: datetime, base: datetime) -> int | None:
    """Give each day of the history a partition of its own, where the table is partitioned by
    day (as a worker adds the days ahead); None where this version has no such layout."""
    try:
        # Only versions with the partitioned layout have this module: the profile runs on both.
        from django_sqltasks.store import partitions
    except ImportError:
        return None
    ahead = (base.date() - start.date()).days + 7
    return int(partitions.add_days("default", days_ahead=ahead, today=start.date()))


def run(
    total: int,
    reuse: bool,
    log: Callable[[str], None],
    fill_record: Path | None = None,
    fill_only: bool = False,
    keep: bool = True,
) -> dict[str, Any] | None:
    """Fill (unless ``reuse`` finds ``total`` tasks there) and measure; with ``fill_only``,
    fill and stop (None); without ``keep``, the search indexes the last step drops are not
    built again (the database is dropped after). ``fill_record`` keeps what a fill measured
    (its time, the claim against the empty table) for a later run that reuses the tasks."""
    ensure_database()
    call_command("migrate", verbosity=0)
    base = timezone.now().replace(microsecond=0) - timedelta(minutes=5)
    results = measure.Results()
    # A run before this one pruned its oldest day: what is left is reused, and counted.
    held = TaskRecord.objects.count() if reuse else 0
    kept = reuse and total * (fill.DAYS - 2) / fill.DAYS <= held <= total
    meta: dict[str, Any] = {
        "vendor": connection.vendor,
        "server": server_version(),
        "tasks": total,
        "partitioned": partitioned(),
    }
    if kept:
        newest = TaskRecord.objects.order_by("-finished_at").values_list("finished_at", flat=True)
        base = (newest.first() or base) + timedelta(seconds=1)
        log(f"reusing {held:,} tasks")
        meta["tasks_held"] = held
        if fill_record is not None and fill_record.exists():
            filled = json.loads(fill_record.read_text())
            results.claim_empty_ms = filled.pop("claim_empty_ms")
            meta |= filled
    else:
        empty_tables()
        meta["day_partitions_added"] = add_partitions(fill.start_of(base), base)
        log("claim against the empty table")
        results.claim_empty_ms = measure.claim_ms()
        log(f"filling {total:,} tasks over 30 days")
        start = time.perf_counter()
        fill.fill(total, base, lambda done: log(f"  {done:,} rows"))
        meta["fill_seconds"] = round(time.perf_counter() - start, 1)
    log("VACUUM ANALYZE" if connection.vendor == "postgresql" else "ANALYZE")
    measure.analyze(vacuum=True)
    if not kept and fill_record is not None:
        fill_record.parent.mkdir(parents=True, exist_ok=True)
        fill_record.write_text(
            json.dumps(
                {
                    "fill_seconds": meta["fill_seconds"],
                    "day_partitions_added": meta["day_partitions_added"],
                    "claim_empty_ms": results.claim_empty_ms,
                }
            )
        )
    if fill_only:
        return None
    middle = measure.middle_row(total)
    tags = any(f.attname == "tags" for f in TaskRecord._meta.concrete_fields)
    log("admin pages")
    results.pages = measure.admin_pages(
        total, middle, str(middle.args[0]), "customer-42" if tags else None
    )
    log("claim beside the history")
    results.claim_full_ms = measure.claim_ms()
    log("a day's prune")
    # The oldest whole day left: prune's cutoff (the end of that day) is its "now" less the
    # days kept.
    finished = TaskRecord.objects.finished().order_by("finished_at")
    oldest = finished.values_list("finished_at", flat=True)
    first = (oldest.first() or base).astimezone(UTC)
    day_end = first.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    kept_days = fill.DAYS - 1
    results.prune = measure.prune_a_day(day_end + timedelta(days=kept_days), kept_days)
    # Last, as it drops the search indexes: built again only for a database that is kept
    # (at 50 million tasks the argument index takes about 17 minutes to build).
    log("enqueue, with and without the search indexes")
    results.enqueue = measure.enqueue_with_and_without_search_indexes(rebuild=keep)
    return {"meta": meta, **asdict(results)}


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f} ms"


def size(value: int | None) -> str:
    if value is None:
        return "-"
    if value < 2**20:
        return f"{value / 2**10:,.0f} KiB"
    return f"{value / 2**20:,.1f} MiB" if value < 2**30 else f"{value / 2**30:,.2f} GiB"


def markdown(results: dict[str, Any]) -> str:
    """The table of one run, with its heading."""
    meta = results["meta"]
    lines = [
        f"### scale: {meta.get('tasks_held', meta['tasks']):,} finished tasks on {meta['server']}"
        + (" (partitioned table)" if meta.get("partitioned") else ""),
        "",
        f"{meta['date']}, commit {meta['commit']}; {meta['machine']}; load {meta['load']}.",
        f"`{meta['command']}`"
        + (f"; fill {meta['fill_seconds']} s" if "fill_seconds" in meta else ""),
        "",
        "| What | Time | Note |",
        "|---|---|---|",
    ]
    for page in results["pages"]:
        note = page["note"] or (
            "" if page["found"] is None else ("found" if page["found"] else "NOT found")
        )
        if page["status"] not in (None, 200):
            note = f"HTTP {page['status']} {note}".strip()
        lines.append(f"| {page['label']} | {ms(page['ms'])} | {note} |")
    empty, full = results["claim_empty_ms"], results["claim_full_ms"]
    ratio = f"{full / empty:.2f}x the empty table's" if empty and full else ""
    lines.append(
        f"| claim of {measure.CLAIM_BATCH}, empty table | {ms(empty)} | "
        f"median of {measure.CLAIMS} |"
    )
    lines.append(f"| claim of {measure.CLAIM_BATCH}, beside the history | {ms(full)} | {ratio} |")
    prune = results["prune"]
    wal = "" if prune["wal_bytes"] is None else f", WAL {size(prune['wal_bytes'])}"
    lines.append(
        f"| prune of a day ({prune['rows']:,} rows) | {prune['seconds'] * 1000:,.0f} ms | "
        f"table {size(prune['bytes_before'])} → {size(prune['bytes_after'])}{wal} |"
    )
    enqueue = results["enqueue"]
    without = enqueue.get("without")
    lines.append(
        f"| enqueue, with the search indexes | {enqueue['with']:,.0f}/s | "
        f"{', '.join(enqueue['search_indexes']) or enqueue.get('note', '')} |"
    )
    lines.append(
        "| enqueue, without them | "
        + ("-" if without is None else f"{without:,.0f}/s")
        + f" | {enqueue.get('note', '')} |"
    )
    return "\n".join(lines)
