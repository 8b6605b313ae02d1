"""Durations written for operators (the admin, ``tasks_status``, the checks)."""

from __future__ import annotations

from datetime import timedelta


def short_age(value: timedelta | None) -> str:
    """Write a duration the way an operator reads it: 42s, 17m, 5h, 3d."""
    if value is None:
        return "-"
    seconds = int(value.total_seconds())
    for limit, unit, size in ((120, "s", 1), (7200, "m", 60), (172800, "h", 3600)):
        if seconds < limit:
            return f"{seconds // size}{unit}"
    return f"{seconds // 86400}d"


def short(seconds: float) -> str:
    """A duration as an operator reads it: 42s, 17m, 5h, 3d."""
    return short_age(timedelta(seconds=seconds))
