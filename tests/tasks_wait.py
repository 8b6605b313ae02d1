"""Tasks of the tests of waiting for results (tests/store/test_waiting.py)."""

from __future__ import annotations

from django_sqltasks.compat import task
from tests import events


@task
def wait_at_then(gate: str, fail: bool = False) -> str:
    """Tell the test it started, wait until it opens ``gate``, then succeed or raise."""
    events.note("start")
    events.wait_at(gate)
    if fail:
        raise ValueError("failed on purpose")
    return "done"
