"""Command-line value checks shared by the management commands; errors name the rule."""

from __future__ import annotations

import argparse
import math


def _whole_number(value: str, least: int) -> int:
    try:
        number = int(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {value!r}") from e
    if number < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, not {number}")
    return number


def positive_int(value: str) -> int:
    return _whole_number(value, 1)


def non_negative_int(value: str) -> int:
    return _whole_number(value, 0)


def positive_seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, not {value!r}") from e
    if not math.isfinite(number) or number <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive, finite number, not {value!r}")
    return number


def days(value: str) -> float:
    try:
        number = float(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"must be a number of days, not {value!r}") from e
    if not math.isfinite(number) or number < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more days, not {value!r}")
    return number
