"""The ranges numeric options and task arguments must fall in.

Each bound is far above any sensible value and below the point where something overflows: a
``timedelta`` (about 2.7e6 years), an ``Event.wait()`` timeout (about 292 years), an interval
in SQL, or a counter column. A value past one would not fail where it is set but later, in a
worker, where it could leave a task RUNNING.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

MAX_INTERVAL = 86400.0  # seconds: the longest lease, heartbeat or poll interval (a day)
MAX_DELAY = 366 * 86400.0  # seconds: the longest backoff, timeout or snooze (a year)
MAX_DAYS = 36500  # days: the longest a finished task can be kept by age (a century)
MAX_COUNT = 2**31 - 1  # attempts, rescues, snoozes, concurrency: PostgreSQL's integer columns


def is_number(value: Any, least: float, most: float, *, above: bool = False) -> bool:
    """Whether ``value`` is a finite int or float (not a bool) from ``least`` (exclusive when
    ``above``) to ``most``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    if value > most:  # an int too large for a float is compared exactly
        return False
    return value > least if above else value >= least


def is_count(value: Any, least: int) -> TypeGuard[int]:
    """Whether ``value`` is an int (not a bool) from ``least`` to ``MAX_COUNT``."""
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= MAX_COUNT


def wait_timeout(value: Any) -> float | None:
    """Check the ``timeout`` of a wait for a result (``result.wait()``): None (no limit), or a
    number of seconds from 0 to MAX_DELAY; raise TypeError or ValueError naming the rule."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"timeout must be a number of seconds (or None: no limit), not {value!r} "
            f"({type(value).__name__})."
        )
    if not is_number(value, 0, MAX_DELAY):
        raise ValueError(
            f"timeout must be a finite number of seconds from 0 to {MAX_DELAY:g} (366 days), "
            f"not {value!r}."
        )
    return float(value)
