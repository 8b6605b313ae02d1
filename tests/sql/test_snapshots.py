"""The SQL snapshots (sql/snapshots/) are what the dialects render now: a statement changed
without its snapshot fails here, with the diff and the command that renders them again."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sql.snapshots import COMMAND, differences, render


def test_the_committed_sql_snapshots_are_what_the_dialects_render() -> None:
    found = differences(render())
    if found:
        pytest.fail("".join(found) + f"\nThe SQL snapshots are out of date: run {COMMAND}.")


def test_a_changed_statement_fails_with_its_diff(tmp_path: Path) -> None:
    rendered = render()
    path = next(iter(rendered))
    (tmp_path / path).parent.mkdir(parents=True)
    (tmp_path / path).write_text(rendered[path].replace("SELECT", "SELECT DISTINCT", 1))
    (tmp_path / "mysql" / "gone.sql").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "mysql" / "gone.sql").write_text("SELECT 1;\n")
    found = differences(rendered, tmp_path)
    assert any(f"+++ sql/snapshots/{path} (rendered)" in diff for diff in found)
    assert any("sql/snapshots/mysql/gone.sql (committed)" in diff for diff in found)
    assert len(found) == len(rendered) + 1  # the others are missing from tmp_path
