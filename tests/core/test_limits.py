"""Limits on their own: rates parsed with their rule, an override over the settings, the
sliding window of starts, and the keys a limited task counts against."""

from __future__ import annotations

from typing import Any

import pytest

from django_sqltasks.core.limits import (
    MAX_RATE,
    Limit,
    check_concurrency,
    overridden,
    parse_override,
    parse_rate,
    queue_key,
    rate_key,
    record_starts,
    task_path_of,
)


def test_rates_are_counts_per_second_minute_or_hour() -> None:
    assert parse_rate("10/s", "rate") == (10, 1.0)
    assert parse_rate(" 100 / m ", "rate") == (100, 60.0)
    assert parse_rate("1000/h", "rate") == (1000, 3600.0)


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("10/d", "must be a string like '10/s'"),
        (10, "must be a string like '10/s'"),
        ("0/s", f"must allow 1 to {MAX_RATE:,} starts a period, not 0"),
        ("9" * 50 + "/s", "not 99999999999999999999..."),
    ],
)
def test_a_bad_rate_names_its_field_and_rule(value: Any, rule: str) -> None:
    with pytest.raises(ValueError, match="QUEUE_LIMITS") as refused:
        parse_rate(value, "QUEUE_LIMITS['q'].rate")
    assert rule in str(refused.value)


def test_concurrency_is_a_whole_number_of_at_least_one() -> None:
    assert check_concurrency(3, "concurrency") == 3
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="concurrency must be a whole number"):
            check_concurrency(bad, "concurrency")


def test_an_override_replaces_only_the_limits_it_sets() -> None:
    settings = Limit(concurrency=4, rate=10, period=1.0)
    assert overridden(settings, None) == settings
    assert overridden(settings, Limit(concurrency=2)) == Limit(concurrency=2, rate=10, period=1.0)
    assert overridden(settings, Limit(rate=5, period=60.0)) == Limit(4, 5, 60.0)
    assert parse_override("2", None, fields=("--concurrency", "--rate")) == Limit(concurrency=2)
    with pytest.raises(ValueError, match="--concurrency must be at least 1"):
        parse_override(0, None, fields=("--concurrency", "--rate"))


def test_starts_outside_the_period_are_forgotten_and_at_most_rate_kept() -> None:
    limit = Limit(rate=3, period=10.0)
    assert record_starts(limit, [80.0, 95.0, "x"], 100.0, 1) == [95.0, 100.0]  # type: ignore[list-item]
    assert record_starts(limit, [95.0], 100.0, 5) == [100.0, 100.0, 100.0]
    assert record_starts(Limit(concurrency=1), [95.0], 100.0, 1) == []


def test_the_keys_a_task_counts_against() -> None:
    assert queue_key("emails") == "queue:emails"
    assert task_path_of("queue:emails") is None
    assert task_path_of("task:app.tasks.send") == "app.tasks.send"
    assert rate_key("task:app.tasks.send#customer-7") == "task:app.tasks.send"
    assert rate_key("fair:app.tasks.send") == "task:app.tasks.send"
    assert task_path_of("fair:app.tasks.send") == "app.tasks.send"
