"""The planner's estimate of how many rows a query returns: a count that costs no scan, for a
question asked of millions of rows ("about 1,200,000 tasks match")."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db.backends.utils import CursorWrapper


def estimated_rows(
    cursor: CursorWrapper, vendor: str, sql: str, params: Sequence[Any]
) -> int | None:
    """The rows the planner expects ``sql`` to return, or None where it says nothing (SQLite)."""
    if vendor == "postgresql":
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
        if isinstance(plan, str | bytes):
            plan = json.loads(plan)
        return int(plan[0]["Plan"]["Plan Rows"])
    if vendor == "mysql":
        cursor.execute(f"EXPLAIN {sql}", params)
        names = [column[0] for column in cursor.description]
        row = dict(zip(names, cursor.fetchone(), strict=True))
        rows = float(row.get("rows") or 0)
        # MariaDB's "filtered" is the share of those rows the rest of the WHERE keeps.
        return round(rows * float(row.get("filtered") or 100) / 100)
    return None
