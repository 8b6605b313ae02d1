"""Tasks of the periodic-schedule tests."""

from __future__ import annotations

import os
import uuid

from django_sqltasks.compat import task
from tests import events

HOLD_ENV = "SQLTASKS_TEST_SCHEDULE_GATE"


def _held_key(label: str = "held") -> str:
    """Called at enqueue, inside the scheduler's election transaction: with HOLD_ENV set, tell
    the test and wait at its gate, so that the test can kill the worker mid-tick."""
    gate = os.environ.get(HOLD_ENV)
    if gate:
        events.note("enqueue_held", label=label)
        events.wait_at(gate)
    return uuid.uuid4().hex  # a key of its own: no call is deduplicated


@task(dedupe=_held_key)
def held(label: str = "held") -> str:
    return label
