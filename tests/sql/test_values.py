"""The values that cross to each database (``sql/values.py``): a claimed row decoded from what
the database returns."""

from __future__ import annotations

import uuid

import pytest

from django_sqltasks.sql.dialect import Dialect

SOUND_ROW = (
    "0196f5a2-1c3e-7b4d-8e9f-a0b1c2d3e4f5",
    "tests.tasks.add",
    "default",
    "default",
    0,
    "[1, 2]",
    '{"x": [3]}',
    "2026-01-02T03:04:05.123456+00:00",
    None,
    "2026-01-02T03:04:06+00:00",
    "2026-01-02T03:04:07+00:00",
    "[]",
    '["w"]',
    1,
    0,
    None,
    None,
)


def _damaged(index: int, value: object) -> tuple[object, ...]:
    return (*SOUND_ROW[:index], value, *SOUND_ROW[index + 1 :])


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        (SOUND_ROW, None),
        (_damaged(5, "[1, "), "column args holds text that cannot be decoded as JSON"),
        (_damaged(6, "[]"), "column kwargs holds a JSON list, not a object"),
        (_damaged(11, '"text"'), "column errors holds a JSON str, not a list"),
        (_damaged(12, "[" * 1030 + "]" * 1030), "column worker_ids holds text that cannot be"),
        (_damaged(9, "yesterday"), "a date column holds 'yesterday'"),
        (_damaged(0, "{0196f5a2-1c3e-7b4d-8e9f-a0b1c2d3e4f5}"), None),  # UUID() reads braces
    ],
)
def test_a_claimed_row_decoded_in_one_pass_matches_one_checked_column_by_column(
    dialect: Dialect, values: tuple[object, ...], problem: str | None
) -> None:
    """The one-pass decoding of a claimed row gives the same row as the column-by-column one,
    and leaves any row it does not take whole to it, which says what is wrong."""
    row = dialect._claimed_row(values)
    if problem is None or "date" not in problem:  # a bad date reads as the time it is read
        assert row == dialect._checked_claimed_row(values)
    if problem is None:
        assert dialect._sound_claimed_row(values) == row and row.corrupt is None
        assert row.id == uuid.UUID("0196f5a2-1c3e-7b4d-8e9f-a0b1c2d3e4f5")
        assert (row.args, row.kwargs, row.worker_ids) == ([1, 2], {"x": [3]}, ["w"])
        assert row.enqueued_at.isoformat() == "2026-01-02T03:04:05.123456+00:00"
    else:
        assert row.corrupt is not None and row.corrupt.startswith(problem)


def test_the_rows_of_one_claim_each_get_their_own_times_and_their_id_as_text(
    dialect: Dialect,
) -> None:
    """Decoding reuses a time already decoded for the same text (the rows of one claim share
    its clock); a row whose times differ still gets its own, and the text id is the UUID's."""
    retried = list(SOUND_ROW)
    retried[0] = "0196f5a2-1c3e-7b4d-8e9f-a0b1c2d3e4f6"
    retried[9] = "2026-01-01T00:00:00+00:00"  # started on an earlier attempt
    first = list(SOUND_ROW)
    first[10] = first[9]  # a first attempt: both times are the claim's
    rows = [dialect._claimed_row(values) for values in (SOUND_ROW, retried, first, SOUND_ROW)]
    for row, values in zip(rows, (SOUND_ROW, retried, first, SOUND_ROW), strict=True):
        assert row.started_at.isoformat() == values[9]
        assert row.last_attempted_at.isoformat() == values[10]
        assert row.text_id == str(row.id) == values[0]
    assert rows[2].last_attempted_at is rows[2].started_at is rows[3].started_at  # decoded once
