"""The rules of a durable task's steps, sleeps and events, each refusal naming the rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from django_sqltasks.core.durable import (
    MAX_SLEEP_SECONDS,
    check_event,
    check_name,
    check_seconds,
    check_until,
    step_key,
)
from django_sqltasks.exceptions import InvalidStep

NOW = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        (3, "must be a string of 1 to 200 characters, not an int"),
        ("", "must be 1 to 200 characters long, not 0"),
        ("x" * 201, "must be 1 to 200 characters long, not 201"),
        ("a\x00b", "contains a NUL character"),
    ],
)
def test_a_step_name_is_refused_with_its_rule(value: Any, rule: str) -> None:
    with pytest.raises(InvalidStep, match=rule):
        check_name(value, "The step name")


def test_an_event_key_may_be_an_int_but_not_a_bool() -> None:
    assert check_event("paid", 42) == ("paid", "42")
    with pytest.raises(InvalidStep, match="The event key must be a string"):
        check_event("paid", True)


@pytest.mark.parametrize(
    "value", [-1, float("nan"), float("inf"), MAX_SLEEP_SECONDS + 1, True, "5"]
)
def test_seconds_out_of_range_or_not_numbers_are_refused(value: Any) -> None:
    with pytest.raises(InvalidStep, match="sleep"):
        check_seconds(value, "sleep(seconds)")


def test_seconds_may_be_a_timedelta_and_none_where_allowed() -> None:
    assert check_seconds(timedelta(minutes=2), "sleep(seconds)") == 120.0
    assert check_seconds(None, "timeout", allow_none=True) is None


def test_until_is_made_aware_and_at_most_ten_years_ahead() -> None:
    naive = datetime(2030, 1, 2)
    assert check_until(naive, NOW).tzinfo is not None
    with pytest.raises(InvalidStep, match="at most ten years ahead"):
        check_until(NOW + timedelta(seconds=MAX_SLEEP_SECONDS + 1), NOW)
    with pytest.raises(InvalidStep, match="must be a datetime"):
        check_until("tomorrow", NOW)


def test_a_step_key_is_the_same_on_every_attempt_and_numbers_repeats() -> None:
    assert step_key("t1", "charge", 0) == "t1:charge"
    assert step_key("t1", "charge", 2) == "t1:charge:2"
