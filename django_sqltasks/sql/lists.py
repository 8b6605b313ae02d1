"""The reads behind the admin's lists that the ORM cannot say: how many rows a filter selects,
estimated by the database instead of counted, and the queues holding waiting tasks, read by a
skip scan of the claim's index instead of a DISTINCT over every waiting row."""

from __future__ import annotations

import json
from typing import Any

from django.db import connections
from django.db.models import QuerySet


def estimated_rows(queryset: QuerySet[Any]) -> int | None:
    """The database's estimate of how many rows ``queryset`` selects, or None where it has no
    estimate worth showing (SQLite; MariaDB for a filtered list; a PostgreSQL table never
    analysed, whose planner guesses from its size on disk)."""
    if queryset.query.is_empty():  # .none(): no SQL to explain
        return 0
    connection = connections[queryset.db]
    table = queryset.model._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Of a partitioned table, its leaves (the parents hold no rows); None when not one
            # has been analysed: the planner's guess is then the table's size on disk.
            cursor.execute(
                "SELECT COALESCE(max(c.reltuples), -1) FROM pg_partition_tree(%s::regclass) t "
                "JOIN pg_class c ON c.oid = t.relid WHERE t.isleaf",
                [connection.ops.quote_name(table)],
            )
            if cursor.fetchone()[0] < 0:
                return None
            plan = json.loads(queryset.order_by().explain(format="json"))
            return int(plan[0]["Plan"]["Plan Rows"])
        if connection.vendor == "mysql" and not queryset.query.where:
            cursor.execute(
                "SELECT TABLE_ROWS FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
                [table],
            )
            row = cursor.fetchone()
            return None if row is None or row[0] is None else int(row[0])
    return None


def ready_queue_names(queryset: QuerySet[Any], backend_name: str) -> list[str]:
    """The queues of ``backend_name`` holding READY tasks of no limit: one probe of
    ``sqltasks_ready_idx`` per queue (a recursive skip scan), however many tasks wait."""
    sql, params = ready_queues_statement(queryset, backend_name)
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def ready_queues_statement(queryset: QuerySet[Any], backend_name: str) -> tuple[str, list[Any]]:
    """The skip scan of ``ready_queue_names``, as SQL and its parameters."""
    qn = connections[queryset.db].ops.quote_name
    table = qn(queryset.model._meta.db_table)
    waiting = "status = 'READY' AND limit_key IS NULL AND backend_name = %s"
    sql = (
        f"WITH RECURSIVE queues (name) AS ("
        f"SELECT name FROM (SELECT queue_name AS name FROM {table} WHERE {waiting} "
        f"ORDER BY queue_name LIMIT 1) first_queue "
        f"UNION ALL SELECT (SELECT queue_name FROM {table} WHERE {waiting} "
        f"AND queue_name > queues.name ORDER BY queue_name LIMIT 1) FROM queues "
        f"WHERE queues.name IS NOT NULL) SELECT name FROM queues WHERE name IS NOT NULL"
    )
    return sql, [backend_name, backend_name]
