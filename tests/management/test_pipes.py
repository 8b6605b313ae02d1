"""A command piped into ``head`` stops without a traceback when its reader goes away."""

from __future__ import annotations

import pytest

from tests import forkserver
from tests.conftest import ROOT, worker_env


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "command",
    [
        ["tasks_status"],
        ["tasks_queue", "limits"],
        ["tasks_check"],
        ["tasks_prune", "--dry-run"],
        ["check"],
        ["tasks_worker", "--help"],
    ],
)
def test_a_command_piped_into_head_stops_without_a_traceback(command: list[str]) -> None:
    # As `python -m django ... | head` (forked from the fork server, as workers are).
    process = forkserver.popen_django(command, worker_env(), worker_env(), str(ROOT))
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # head has read its lines: the command's next write fails
    errors = process.stderr.read()
    process.stderr.close()
    status = process.wait(timeout=60)
    assert "Traceback" not in errors and "BrokenPipeError" not in errors, errors
    assert status in (0, 1), errors
