"""Concurrency and rate limits: what they are, how they are written, and which key a task has.

A limited task is stored with a *limit key* (``TaskRecord.limit_key``); the worker's main claim
leaves such tasks alone and its limited claim (``worker/limited.py``) takes them while their
limits allow, under a lock on the limit's ``TaskLimit`` row. Keys:

- ``task:<path>``: a task with ``concurrency_limit`` and no ``concurrency_key``, or with only a
  ``rate_limit``;
- ``task:<path>#<key>``: a task with a ``concurrency_key``; its concurrency is counted per key,
  its rate (if any) on ``task:<path>``;
- ``queue:<name>``: a queue of ``OPTIONS["QUEUE_LIMITS"]``. Its tasks keep a NULL limit key
  (unless their task is limited too): the worker's own settings say which queues are limited;
- ``fair:<path>#<key>``: a task with a ``fair_key`` (and no ``concurrency_key``): the limited
  claim takes such keys round robin (``worker/fair.py``); the task's own limits, if any, are
  counted on ``task:<path>``. With a ``concurrency_key`` (which must then be the same), the
  task keeps its ``task:<path>#<key>`` and those keys are taken round robin instead.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..compat import InvalidTask, Task
from .bounds import MAX_COUNT, is_count
from .columns import MAX_LIMIT_KEY_LENGTH
from .serialization import text_problem

MAX_RATE = 10_000  # starts a period: the sliding window keeps one timestamp per start
PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
FAIR_PREFIX = "fair:"
# The longest key a fair_key callable may return, in characters: a key is a name (a tenant's,
# a customer's), and a longer one is more likely a payload passed by mistake.
MAX_FAIR_KEY_LENGTH = 200
RATE_PATTERN = re.compile(r"^\s*(\d+)\s*/\s*([smh])\s*$")


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``concurrency`` RUNNING, and at most ``rate`` starts in any ``period`` seconds;
    None: no such limit."""

    concurrency: int | None = None
    rate: int | None = None
    period: float | None = None

    def __bool__(self) -> bool:
        return self.concurrency is not None or self.rate is not None


def parse_rate(value: object, field: str) -> tuple[int, float]:
    """``"N/s"``, ``"N/m"`` or ``"N/h"`` as (N, seconds); ValueError naming ``field``."""
    match = RATE_PATTERN.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(
            f"{field} must be a string like '10/s', '100/m' or '1000/h' (a whole number of "
            f"starts per second, minute or hour), not {value!r}."
        )
    digits = match.group(1)
    # Past 4,300 digits int() itself refuses: no need to read more than a count could have.
    count = int(digits) if len(digits) <= 9 else MAX_RATE + 1
    if not 1 <= count <= MAX_RATE:
        shown = digits if len(digits) <= 20 else digits[:20] + "..."
        raise ValueError(f"{field} must allow 1 to {MAX_RATE:,} starts a period, not {shown}.")
    return count, PERIODS[match.group(2)]


def check_concurrency(value: object, field: str) -> int:
    if not is_count(value, 1):
        raise ValueError(
            f"{field} must be a whole number of at least 1, at most {MAX_COUNT:,}, not {value!r}."
        )
    return value


def task_limit(task: Task) -> Limit:
    """The limits ``@task(concurrency_limit=..., rate_limit=...)`` put on ``task``."""
    concurrency = getattr(task, "concurrency_limit", None)
    rate_text = getattr(task, "rate_limit", None)
    rate, period = (None, None) if rate_text is None else parse_rate(rate_text, "rate_limit")
    return Limit(concurrency=concurrency, rate=rate, period=period)


def validate_task_limits(task: Task) -> None:
    """Raise ``InvalidTask`` naming the option and the rule when a limit option is wrong."""
    concurrency = getattr(task, "concurrency_limit", None)
    key = getattr(task, "concurrency_key", None)
    try:
        if concurrency is not None:
            check_concurrency(concurrency, "concurrency_limit")
        if getattr(task, "rate_limit", None) is not None:
            parse_rate(task.rate_limit, "rate_limit")  # type: ignore[attr-defined]
    except ValueError as e:
        raise InvalidTask(str(e)) from e
    if key is not None:
        if concurrency is None:
            raise InvalidTask(
                "concurrency_key needs concurrency_limit: it says what the limit is counted per."
            )
        if not callable(key) and key != "subject":
            raise InvalidTask(f"concurrency_key must be a callable or 'subject', not {key!r}.")
    fair = getattr(task, "fair_key", None)
    if fair is not None:
        if not callable(fair) and fair != "subject":
            raise InvalidTask(f"fair_key must be a callable or 'subject', not {fair!r}.")
        if key is not None and key != fair:
            raise InvalidTask(
                "fair_key and concurrency_key must be the same when both are set: tasks of a "
                "concurrency_key are taken round robin across its keys, so leave out fair_key "
                "or pass the same callable to both."
            )


def limit_key(task: Task, args: list[Any], kwargs: dict[str, Any]) -> str | None:
    """The limit key of one call of ``task``, or None when it has no limit."""
    concurrency = getattr(task, "concurrency_limit", None)
    fair = getattr(task, "fair_key", None)
    if fair is not None and getattr(task, "concurrency_key", None) is None:
        return fair_limit_key(task, fair, args, kwargs)
    if concurrency is None and getattr(task, "rate_limit", None) is None:
        return None
    base = f"task:{task.module_path}"
    key_of = getattr(task, "concurrency_key", None)
    if key_of is None:
        return base[:MAX_LIMIT_KEY_LENGTH]
    key = call_key(task, "concurrency_key", key_of, args, kwargs)
    scoped = f"{base}#{key}"
    if len(scoped) > MAX_LIMIT_KEY_LENGTH:
        digest = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
        scoped = f"{base[: MAX_LIMIT_KEY_LENGTH - len(digest) - 1]}#{digest}"
    return scoped


def fair_limit_key(task: Task, fair: Any, args: list[Any], kwargs: dict[str, Any]) -> str:
    """``fair:<path>#<key>``, the limit key of one call of a task with a ``fair_key``;
    ``InvalidTask`` naming fair_key and the rule when its callable raises or returns a key
    that cannot be stored."""
    try:
        key = call_key(task, "fair_key", fair, args, kwargs)
    except InvalidTask:
        raise
    except Exception as e:
        raise InvalidTask(
            f"The fair_key callable of {task.module_path} raised {type(e).__name__}: {e}"
        ) from e
    if fair != "subject" and len(key) > MAX_FAIR_KEY_LENGTH:
        raise InvalidTask(
            f"The fair_key callable of {task.module_path} returned a key of {len(key):,} "
            f"characters, over the {MAX_FAIR_KEY_LENGTH} a fair key may have: return a name "
            "(a tenant's id), not data."
        )
    scoped = f"{FAIR_PREFIX}{task.module_path}#{key}"
    if len(scoped) > MAX_LIMIT_KEY_LENGTH:
        digest = hashlib.sha256(key.encode()).hexdigest()
        scoped = f"{FAIR_PREFIX}{task.module_path}#sha256:{digest}"
    return scoped[:MAX_LIMIT_KEY_LENGTH]


def call_key(task: Task, option: str, key_of: Any, args: list[Any], kwargs: dict[str, Any]) -> str:
    """The key one call of ``task`` has under ``option`` (``dedupe`` or ``concurrency_key``),
    which is "subject" (the call's subject: ``str(subject)``) or a callable of the arguments."""
    if key_of == "subject":
        subject = getattr(task, "subject", None)
        if subject is None:
            raise InvalidTask(
                f"{task.module_path} keys its {option} by subject ({option}='subject'): "
                "enqueue it with .using(subject=obj)."
            )
        return str(subject)
    return key_of_call(task, option, key_of, args, kwargs)


def key_of_call(
    task: Task,
    option: str,
    make_key: Callable[..., object],
    args: list[Any],
    kwargs: dict[str, Any],
) -> str:
    """The key ``make_key`` (a task's dedupe or concurrency_key callable) returns for a call;
    ``InvalidTask`` naming the option when it is not a non-empty, storable str."""
    key = make_key(*args, **kwargs)
    if not isinstance(key, str) or not key:
        raise InvalidTask(
            f"The {option} callable of {task.module_path} must return a non-empty str, not {key!r}."
        )
    problem = text_problem(key)
    if problem is not None:
        raise InvalidTask(
            f"The {option} callable of {task.module_path} returned the key {key!r}, which "
            f"{problem}."
        )
    return key


def rate_key(key: str) -> str:
    """The key whose row counts the rate of tasks under ``key`` (the task's, not the key's)."""
    base = key.split("#", 1)[0]
    if base.startswith(FAIR_PREFIX):
        return "task:" + base[len(FAIR_PREFIX) :]
    return base


def concurrency_key_of(key: str) -> str:
    """The key whose row counts the concurrency of tasks under ``key``: its own, but the
    task's for a fair key (a fair task's concurrency_limit is the whole task's)."""
    return rate_key(key) if key.startswith(FAIR_PREFIX) else key


def is_fair(key: str) -> bool:
    """Whether tasks of limit key ``key`` are taken round robin across keys."""
    return key.startswith(FAIR_PREFIX)


def fair_prefix(path: str) -> str:
    """What the limit keys of a fair task's calls start with."""
    return f"{FAIR_PREFIX}{path}#"


def queue_key(queue_name: str) -> str:
    return f"queue:{queue_name}"


def task_path_of(key: str) -> str | None:
    """The task path in a task limit key; None for a queue's key."""
    if not key.startswith(("task:", FAIR_PREFIX)):
        return None
    return rate_key(key)[len("task:") :]


def parse_queue_limits(value: object, name: str = "QUEUE_LIMITS") -> dict[str, Limit]:
    """``OPTIONS["QUEUE_LIMITS"]``: ``{queue: {"concurrency": N, "rate": "N/s"}}``; ValueError
    naming the entry and the rule."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{name} must be a dict of queue name to limits, not {type(value).__name__}."
        )
    limits: dict[str, Limit] = {}
    for queue, spec in value.items():
        where = f"{name}[{queue!r}]"
        if not isinstance(queue, str) or not queue:
            raise ValueError(f"{name} keys must be queue names, not {queue!r}.")
        if not isinstance(spec, Mapping):
            raise ValueError(
                f"{where} must be a dict like {{'concurrency': 5, 'rate': '100/m'}}, not {spec!r}."
            )
        unknown = sorted(set(map(str, spec)) - {"concurrency", "rate"})
        if unknown:
            raise ValueError(
                f"{where} has unknown keys {unknown}: the limits are 'concurrency' and 'rate'."
            )
        concurrency = spec.get("concurrency")
        if concurrency is not None:
            check_concurrency(concurrency, f"{where}['concurrency']")
        rate = period = None
        if spec.get("rate") is not None:
            rate, period = parse_rate(spec["rate"], f"{where}['rate']")
        limit = Limit(concurrency=concurrency, rate=rate, period=period)
        if not limit:
            raise ValueError(f"{where} sets no limit: give 'concurrency', 'rate' or both.")
        limits[queue] = limit
    return limits


def parse_override(concurrency: object, rate: object, *, fields: tuple[str, str]) -> Limit:
    """A queue's run-time override (``tasks_queue limit``, the admin): ``concurrency`` a whole
    number (or its digits) and ``rate`` like ``"10/s"``, either None to keep the settings' value;
    ValueError naming the field (``fields``: the names the operator typed) and the rule."""
    concurrency_field, rate_field = fields
    if isinstance(concurrency, str):
        text = concurrency.strip()
        # ASCII digits only: "1e3", "2.0", "+4" or other scripts' digits are refused.
        if text.isascii() and text.isdigit() and len(text) < 20:
            concurrency = int(text)
        else:
            concurrency = text if len(text) <= 40 else text[:40] + "..."
    if concurrency == 0:
        raise ValueError(
            f"{concurrency_field} must be at least 1: a queue that runs nothing is paused "
            "(manage.py tasks_queue pause NAME, or the admin's paused queues)."
        )
    if concurrency is not None:
        check_concurrency(concurrency, concurrency_field)
    count = period = None
    if rate is not None:
        count, period = parse_rate(rate, rate_field)
    limit = Limit(concurrency=concurrency, rate=count, period=period)  # type: ignore[arg-type]
    if not limit:
        raise ValueError(
            f"Give {concurrency_field}, {rate_field} or both: an override sets a limit."
        )
    return limit


def overridden(settings: Limit, override: Limit | None) -> Limit:
    """The limit in force: each of ``override``'s limits, else the settings' one."""
    if override is None:
        return settings
    if override.rate is None:
        rate, period = settings.rate, settings.period
    else:
        rate, period = override.rate, override.period
    concurrency = settings.concurrency if override.concurrency is None else override.concurrency
    return Limit(concurrency=concurrency, rate=rate, period=period)


def rate_text(limit: Limit) -> str | None:
    """``limit``'s rate as written in settings (``"10/s"``); None without one."""
    if limit.rate is None or limit.period is None:
        return None
    unit = {1.0: "s", 60.0: "m", 3600.0: "h"}.get(limit.period)
    return f"{limit.rate}/{unit}" if unit else f"{limit.rate}/{limit.period:g}s"


def room(limit: Limit, running: Callable[[], int], starts: list[float], now: float) -> int | None:
    """How many more tasks ``limit`` lets start now (None: no bound), given a count of those
    RUNNING under it (called only for a concurrency limit) and its recent ``starts``."""
    free: int | None = None
    if limit.concurrency is not None:
        free = max(0, limit.concurrency - running())
    if limit.rate is not None and limit.period is not None:
        recent = sum(1 for t in starts if t > now - limit.period)
        left = max(0, limit.rate - recent)
        free = left if free is None else min(free, left)
    return free


def record_starts(limit: Limit, starts: list[float], now: float, count: int) -> list[float]:
    """``starts`` with ``count`` more at ``now``, keeping only those within the period."""
    if limit.rate is None or limit.period is None or not math.isfinite(now):
        return []
    kept = [t for t in starts if isinstance(t, (int, float)) and t > now - limit.period]
    return (kept + [now] * count)[-limit.rate :]
