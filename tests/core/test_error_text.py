"""A stored error's summary, whatever the row's errors column holds."""

from __future__ import annotations

from typing import Any

import pytest

from django_sqltasks.core.error_text import UNREADABLE, first_line, stored_errors, summary

TRACEBACK = 'Traceback (most recent call last):\n  File "t.py", line 1\nValueError: boom\n'


def test_a_summary_names_the_class_and_the_first_line_of_the_message() -> None:
    error = {"exception_class_path": "builtins.ValueError", "traceback": TRACEBACK}
    assert summary(error) == "ValueError: boom"
    assert summary({"exception_class_path": "x.Gone", "traceback": ""}) == "Gone"
    assert summary({}) == "Error"


def test_the_message_is_found_after_the_traceback_and_may_be_empty() -> None:
    multi = TRACEBACK.replace("ValueError: boom", "ValueError: first\nsecond")
    assert first_line("builtins.ValueError", multi) == "first"
    bare = TRACEBACK.replace("ValueError: boom", "ValueError")
    assert first_line("builtins.ValueError", bare) == ""
    assert first_line("", "\n  a message without a traceback\n") == "a message without a traceback"


@pytest.mark.parametrize(
    ("column", "errors"),
    [
        (None, []),
        ([], []),
        (
            [{"exception_class_path": "a.B", "traceback": "t"}],
            [{"exception_class_path": "a.B", "traceback": "t"}],
        ),
        ({"traceback": "t"}, [{"exception_class_path": "", "traceback": "t"}]),
        ("written by hand", [{"exception_class_path": "", "traceback": "written by hand"}]),
        ([3], [{"exception_class_path": "", "traceback": "3"}]),
    ],
)
def test_any_errors_column_becomes_errors_of_text(column: Any, errors: list[Any]) -> None:
    assert stored_errors(column) == errors


def test_a_value_too_deep_to_show_is_said_so() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    assert stored_errors([[deep]]) == [{"exception_class_path": "", "traceback": UNREADABLE}]
