"""Command-line value checks shared by the management commands; errors name the rule."""

from __future__ import annotations

import argparse
import logging
import math
import unicodedata
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings as django_settings
from django.core.management.base import CommandError, CommandParser

from ..compat import InvalidTaskBackend
from ..core import backends
from ..core.bounds import MAX_DAYS, MAX_DELAY
from ..core.columns import MAX_NAME_LENGTH

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_LEVEL_ALIASES = {"WARN": "WARNING", "FATAL": "CRITICAL"}  # accepted as Celery accepts them


def _whole_number(value: str, least: int, most: int | None = None) -> int:
    try:
        number = int(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {value!a}") from e
    if number < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, not {number}")
    if most is not None and number > most:
        raise argparse.ArgumentTypeError(f"must be at most {most}, not {number}")
    return number


def positive_int(value: str) -> int:
    return _whole_number(value, 1)


def whole_number(least: int, most: int) -> Callable[[str], int]:
    """Return an argparse type accepting whole numbers from ``least`` to ``most``."""

    def check(value: str) -> int:
        return _whole_number(value, least, most)

    return check


def _seconds(value: str, most: float = MAX_DELAY) -> float:
    try:
        number = float(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, not {value!a}") from e
    if not math.isfinite(number) or number <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive, finite number, not {value!a}")
    if number > most:
        raise argparse.ArgumentTypeError(f"must be at most {most:g} seconds, not {value!a}")
    return number


def positive_seconds(value: str) -> float:
    return _seconds(value)


def seconds_at_least(least: float, most: float = MAX_DELAY) -> Callable[[str], float]:
    """Return an argparse type accepting a number of seconds from ``least`` to ``most``."""

    def check(value: str) -> float:
        number = _seconds(value, most)
        if number < least:
            raise argparse.ArgumentTypeError(f"must be at least {least:g} seconds, not {value!a}")
        return number

    return check


def _zero_or_more(value: str, unit: str, most: float) -> float:
    try:
        number = float(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"must be a number of {unit}, not {value!a}") from e
    if not math.isfinite(number) or number < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more {unit}, not {value!a}")
    if number > most:
        raise argparse.ArgumentTypeError(f"must be at most {most:g} {unit}, not {value!a}")
    return number


def non_negative_seconds(value: str) -> float:
    return _zero_or_more(value, "seconds", MAX_DELAY)


def days(value: str) -> float:
    return _zero_or_more(value, "days", MAX_DAYS)


def text(value: str, what: str = "", most: int = MAX_NAME_LENGTH) -> str:
    """Check that ``value`` is 1 to ``most`` characters of UTF-8 text without control characters.

    An argument that is not valid UTF-8 reaches Python as lone surrogates, which no database
    driver can encode: refused here rather than by every query that would carry it.
    """
    subject = f"{what} " if what else ""  # "must …" alone reads after the option's name
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise argparse.ArgumentTypeError(f"{subject}must be valid UTF-8 text, not {value!a}") from e
    if any(unicodedata.category(c) == "Cc" for c in value):
        raise argparse.ArgumentTypeError(
            f"{subject}must not contain control characters (such as NUL), not {value!a}"
        )
    if not 0 < len(value) <= most:
        raise argparse.ArgumentTypeError(
            f"{subject}must be 1 to {most} characters long, not {len(value)}"
        )
    return value


def queue_names(value: str) -> list[str]:
    """Split a ``--queue`` value on commas (Celery's ``-Q a,b``) and check each name."""
    names = [name.strip() for name in value.split(",")]
    if "" in names:
        raise argparse.ArgumentTypeError(f"has an empty queue name: {value!a}")
    # A name given twice is one queue (-Q default,default).
    return list(dict.fromkeys(text(name, "a queue name") for name in names))


# A bare --max-memory-per-child at or above this many MiB (about 98 GiB) is taken for a
# number of KiB, which Celery's option of that name counts, and refused with a hint.
LARGEST_BARE_MEGABYTES = 100_000
MEMORY_UNITS = {  # the power of two of each unit: K, M and G count 1024s, as memory tools do
    **dict.fromkeys(("K", "KB", "KIB"), 10),
    **dict.fromkeys(("M", "MB", "MIB"), 20),
    **dict.fromkeys(("G", "GB", "GIB"), 30),
}


def megabytes(value: str) -> int:
    """A memory size as whole MiB (rounded up): ``512`` (MiB), or with a unit, ``512MB``,
    ``200000KiB``, ``2GiB`` (units count 1024s, as memory tools do)."""
    number, unit = value.strip(), ""
    while number and not number[-1].isdigit():
        number, unit = number[:-1], number[-1] + unit
    shift = MEMORY_UNITS.get(unit.strip().upper()) if unit else 20
    if not number.isdigit() or shift is None or int(number) < 1:
        raise argparse.ArgumentTypeError(
            f"must be a size such as 512 (MiB), 512MB, 200000KiB or 2GiB, not {value!a}"
        )
    size = int(number)
    if not unit and size >= LARGEST_BARE_MEGABYTES:
        raise argparse.ArgumentTypeError(
            f"{size:,} MiB is over {size >> 10:,} GiB: if you meant KiB, as Celery's "
            f"--max-memory-per-child counts, write {size}KiB; for that many MiB, write {size}MB"
        )
    return max(1, -(-(size << shift) >> 20))


def backend_alias(value: str) -> str:
    return text(value, most=255)


def log_level(value: str) -> str:
    """Accept a logging level name in any case, as Celery's ``--loglevel`` does."""
    name = value.strip().upper()
    name = LOG_LEVEL_ALIASES.get(name, name)
    if name not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"must be one of {', '.join(LOG_LEVELS)} (any case), not {value!a}"
        )
    return name


def level_number(name: str) -> int:
    """The ``logging`` level of a name ``log_level`` accepted."""
    level: int = getattr(logging, name)
    return level


def sql_backend(alias: str) -> Any:
    """The ``SQLTaskBackend`` named by ``--backend``; raise ``CommandError`` for an unknown alias
    or a backend of another kind."""
    try:
        return backends.sql_backend(alias)
    except InvalidTaskBackend as e:
        raise backend_error(alias, e) from e


def backend_error(alias: str, error: BaseException) -> CommandError:
    """The error of a backend that cannot be used: blamed on the ``TASKS`` entry when its
    ``BACKEND`` fails to load (whether or not the user passed ``--backend``), and on
    ``--backend`` when the alias is not in ``TASKS`` or names a backend of another kind."""
    if alias not in django_settings.TASKS:
        known = ", ".join(map(repr, django_settings.TASKS)) or "none"
        return CommandError(f"--backend: {alias!r} is not in TASKS (its aliases: {known}).")
    if error.__cause__ is not None:  # Django's handler chains the import's error
        return CommandError(f"TASKS[{alias!r}]: {error}")
    return CommandError(f"--backend: {error}")


def refuse_unknown_queues(backend: Any, names: Iterable[str], option: str = "--queue") -> None:
    """Raise ``CommandError`` for names outside the backend's QUEUES (when it has any), naming
    the ``option`` that gave them.

    A backend with QUEUES refuses every other queue name at enqueue, so no task can be in such
    a queue: the name is most likely a typo, and a worker given it would wait for ever.
    """
    known = set(backend.queues)
    unknown = [name for name in names if name != "*" and known and name not in known]
    if unknown:
        raise CommandError(
            f"{option}: {', '.join(map(repr, unknown))} "
            f"{'is not a queue' if len(unknown) == 1 else 'are not queues'} of backend "
            f"{backend.alias!r}, whose QUEUES are: {', '.join(sorted(known))}" + "."
        )


# The scope of a command that looks at every backend (tasks_health, tasks_check) ----------------


def add_scope_arguments(parser: CommandParser, queues_help: str) -> None:
    """``--backend`` (repeatable; default: every django_sqltasks backend) and ``-Q/--queue``."""
    parser.add_argument(
        "--backend",
        metavar="ALIAS",
        action="append",
        type=backend_alias,
        help="Check this TASKS alias (repeat for several; default: every django_sqltasks backend).",
    )
    parser.add_argument(
        "-Q",
        "--queue",
        metavar="NAME[,NAME...]",
        action="append",
        type=queue_names,
        help=queues_help,
    )


def chosen_scope(options: dict[str, Any]) -> tuple[list[backends.SQLBackend], list[str] | None]:
    """The backends ``--backend`` names (in order; default: every django_sqltasks backend, by
    alias) and the queues ``-Q`` names (None: every queue; so does ``*``). Raise
    ``CommandError`` for an alias that is not a django_sqltasks backend, or a queue outside the
    QUEUES of a chosen backend, before any of them is looked at."""
    configured = backends.sql_backends()
    aliases = options["backend"] or sorted(configured)
    unknown = [alias for alias in aliases if alias not in configured]
    if unknown:
        known = ", ".join(sorted(configured)) or "none"
        raise CommandError(
            f"--backend: {', '.join(map(repr, unknown))} is not a django_sqltasks backend "
            f"(those configured: {known})."
        )
    chosen = [configured[alias] for alias in aliases]
    queues = [name for names in options["queue"] or [] for name in names] or None
    if queues is not None and "*" in queues:
        queues = None
    if queues is not None:
        for backend in chosen:
            refuse_unknown_queues(backend, queues)
    return chosen, queues
