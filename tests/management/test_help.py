"""How the commands print text read from the database: control characters as escapes."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tests.factories import task_row


@pytest.mark.django_db
def test_commands_print_escape_sequences_of_stored_text_as_escapes() -> None:
    task_row(task_path="tests.tasks.gone\x1b[2J\x1b[31m", queue_name="default\x1b]0;owned\x07")
    checked, status = StringIO(), StringIO()
    with pytest.raises(CommandError):  # tasks_check fails when it finds a problem
        call_command("tasks_check", stdout=checked)
    call_command("tasks_status", stdout=status)
    for out in (checked.getvalue(), status.getvalue()):
        assert "\x1b" not in out and "\x07" not in out
    assert "gone\\x1b[2J\\x1b[31m" in checked.getvalue()
    assert "default\\x1b]0;owned\\x07" in status.getvalue()
