"""Fill the task table with N finished tasks spread over 30 days (from a midnight, UTC), in SQL,
fast: one ``INSERT ... SELECT`` per chunk over PostgreSQL's ``generate_series``, MariaDB's
sequence engine (``seq_1_to_N``) or SQLite's recursive CTE. 1 in 33 is FAILED, with one of
three error classes.

The columns come from the model as it is on the checkout being measured: a column this module
does not know gets its field's default (or NULL, or its database default), so the fill runs on
whatever schema the migrations built (a plain table or a partitioned one).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, models

from django_sqltasks.models import TaskRecord

DAYS = 30  # the history's length: from the midnight (UTC) 30 days before the base time to it
FAILED_EVERY = 33  # one task in 33 fails
QUEUES = ("default", "emails", "reports")
PATHS = (
    "shop.tasks.send_receipt",
    "shop.tasks.charge_card",
    "shop.tasks.render_invoice",
    "shop.tasks.sync_stock",
    "shop.tasks.notify_courier",
    "shop.tasks.refresh_search",
    "shop.tasks.export_report",
    "shop.tasks.resize_image",
)
ERRORS = ("smtplib.SMTPServerDisconnected", "builtins.ValueError", "shop.errors.PaymentDeclined")
CHUNK = {"postgresql": 1_000_000, "mysql": 200_000, "sqlite": 500_000}  # rows per INSERT


def address(i: int) -> str:
    """The e-mail address in the arguments of the ``i``-th task (a value to search for)."""
    return f"user{i}@example.com"


class Sql:
    """The expressions of one database, over the row number ``i``."""

    def __init__(self, vendor: str, base: datetime) -> None:
        self.vendor = vendor
        self.base = base
        self.base_ms = int(base.timestamp() * 1000)

    def cat(self, *parts: str) -> str:
        if self.vendor == "mysql":
            return f"CONCAT({', '.join(parts)})"
        return "(" + " || ".join(f"({part})" for part in parts) + ")"

    def div(self, a: str, b: int) -> str:
        """Integer division."""
        return f"({a} DIV {b})" if self.vendor == "mysql" else f"({a} / {b})"

    def text(self, expr: str) -> str:
        return f"CAST({expr} AS CHAR)" if self.vendor == "mysql" else f"CAST({expr} AS TEXT)"

    def hex(self, expr: str, digits: int) -> str:
        if self.vendor == "postgresql":
            return f"lpad(to_hex(({expr})::bigint), {digits}, '0')"
        if self.vendor == "mysql":
            return f"LPAD(LOWER(HEX({expr})), {digits}, '0')"
        return f"printf('%0{digits}x', {expr})"

    def at(self, seconds_ago: str) -> str:
        """The time ``seconds_ago`` (an SQL expression) before the base time."""
        stamp = self.base.strftime("%Y-%m-%d %H:%M:%S.%f")
        if self.vendor == "postgresql":
            return f"(TIMESTAMPTZ '{stamp}+00' - ({seconds_ago}) * INTERVAL '1 second')"
        if self.vendor == "mysql":
            return f"(TIMESTAMP'{stamp}' - INTERVAL ROUND(({seconds_ago}) * 1000000) MICROSECOND)"
        return f"strftime('%Y-%m-%d %H:%M:%f', julianday('{stamp}') - ({seconds_ago}) / 86400.0)"

    def uuid(self, expr: str) -> str:
        return f"CAST({expr} AS uuid)" if self.vendor == "postgresql" else expr

    def json(self, expr: str) -> str:
        return f"CAST({expr} AS jsonb)" if self.vendor == "postgresql" else expr

    def literal(self, value: object) -> str:
        if value is None:
            return "NULL"
        if isinstance(value, bool):
            return (
                ("TRUE" if value else "FALSE") if self.vendor == "postgresql" else str(int(value))
            )
        if isinstance(value, int | float):
            return str(value)
        return "'" + str(value).replace("'", "''") + "'"

    def pick(self, index: str, values: tuple[str, ...]) -> str:
        cases = " ".join(f"WHEN {n} THEN '{v}'" for n, v in enumerate(values))
        return f"CASE {index} % {len(values)} {cases} END"


def start_of(base: datetime) -> datetime:
    """When the history begins: the midnight (UTC) ``DAYS`` days before ``base``, so that its
    oldest day is a whole day (a partition of its own where the table is partitioned by day)."""
    day = (base - timedelta(days=DAYS)).astimezone(UTC)
    return day.replace(hour=0, minute=0, second=0, microsecond=0)


def expressions(sql: Sql, total: int) -> dict[str, str]:
    """The SQL of each known column, for row ``i`` of ``total`` (higher ``i``: newer)."""
    span = (sql.base - start_of(sql.base)).total_seconds()
    age = f"(({total} - i + 0.5) * {span} / {total})"  # seconds before base
    failed = f"(i % {FAILED_EVERY} = 0)"
    enqueued_ms = f"({sql.base_ms} - ROUND(({age} + 2.0) * 1000))"
    error = sql.pick(sql.div("i", FAILED_EVERY), ERRORS)
    sent = sql.json("'{\"sent\": true}'")
    order = sql.cat("'ORD-'", sql.text("i"))
    return {
        # A UUIDv7 of the enqueue's millisecond, unique by its row number.
        "id": sql.uuid(
            sql.cat(
                sql.hex(enqueued_ms, 12),
                "'7'",
                sql.hex("(i * 2654435761) % 4096", 3),
                "'8'",
                sql.hex("i", 15),
            )
        ),
        "task_path": sql.pick("i", PATHS),
        "backend_name": "'default'",
        "queue_name": sql.pick("i", QUEUES),
        "priority": "0",
        "status": f"CASE WHEN {failed} THEN 'FAILED' ELSE 'SUCCESSFUL' END",
        "args": sql.json(
            sql.cat("'[\"user'", sql.text("i"), "'@example.com\", '", sql.text("i"), "']'")
        ),
        "kwargs": sql.json(sql.cat('\'{"order": "\'', order, "'\"}'")),
        "return_value": f"CASE WHEN {failed} THEN NULL ELSE {sent} END",
        "errors": sql.json(
            f"CASE WHEN {failed} THEN "
            + sql.cat(
                '\'[{"exception_class_path": "\'',
                error,
                '\'", "traceback": "Traceback (most recent call last): File shop/tasks.py, '
                "line 42, in run: '",
                error,
                "': order '",
                order,
                "' failed\"}]'",
            )
            + " ELSE '[]' END"
        ),
        "worker_ids": sql.json("'[\"worker-1\"]'"),
        "attempts": "1",
        "enqueued_at": sql.at(f"({age} + 2.0)"),
        "available_at": sql.at(f"({age} + 2.0)"),
        "started_at": sql.at(f"({age} + 1.5)"),
        "last_attempted_at": sql.at(f"({age} + 1.5)"),
        "finished_at": sql.at(age),
        "subject_type": "CASE WHEN i % 4 = 0 THEN 'shop.order' ELSE NULL END",
        "subject_id": f"CASE WHEN i % 4 = 0 THEN {sql.text('i')} ELSE NULL END",
        # One task in five is tagged (NULL otherwise, as an untagged enqueue leaves it).
        "tags": "CASE WHEN i % 5 = 0 THEN "
        + sql.json(
            sql.cat(
                "'[\"customer-'",
                sql.text(f"{sql.div('i', 5)} % 1000"),
                "'\", \"'",
                sql.pick("i", QUEUES),
                "'\"]'",
            )
        )
        + " ELSE NULL END",
    }


def default_of(sql: Sql, field: models.Field[Any, Any]) -> str | None:
    """The SQL of a column this module does not know; None leaves it to its database default."""
    if field.db_default is not models.NOT_PROVIDED:
        return None
    if field.has_default():
        value = field.get_default()
        if isinstance(field, models.JSONField):
            return sql.json(sql.literal(json.dumps(value)))
        return sql.literal(value)
    return "NULL"


def insert_sql(vendor: str, base: datetime, total: int, first: int, last: int) -> str:
    """One INSERT of rows ``first`` to ``last`` (of ``total``)."""
    sql = Sql(vendor, base)
    known = expressions(sql, total)
    columns, values = [], []
    for field in TaskRecord._meta.concrete_fields:
        expr = known.get(field.attname) if field.attname != "tags" or is_list(field) else None
        if expr is None:
            expr = default_of(sql, field)
        if expr is not None:
            columns.append(connection.ops.quote_name(field.column))
            values.append(expr)
    table = connection.ops.quote_name(TaskRecord._meta.db_table)
    into = f"INSERT INTO {table} ({', '.join(columns)})"
    select = f"SELECT {', '.join(values)}"
    if vendor == "postgresql":
        return f"{into} {select} FROM generate_series({first}, {last}) AS s(i)"
    if vendor == "mysql":
        return f"{into} {select} FROM (SELECT seq AS i FROM seq_{first}_to_{last}) AS s"
    return (
        f"WITH RECURSIVE s(i) AS (SELECT {first} UNION ALL SELECT i + 1 FROM s WHERE i < {last}) "
        f"{into} {select} FROM s"
    )


def is_list(field: models.Field[Any, Any]) -> bool:
    """Whether a ``tags`` column is the JSON list this module writes."""
    return isinstance(field, models.JSONField)


def fill(total: int, base: datetime, progress: Callable[[int], None]) -> None:
    """Insert ``total`` finished tasks, the newest finished just before ``base``."""
    vendor = connection.vendor
    chunk = CHUNK[vendor]
    with connection.cursor() as cursor:
        for first in range(1, total + 1, chunk):
            last = min(first + chunk - 1, total)
            cursor.execute(insert_sql(vendor, base, total, first, last))
            progress(last)
