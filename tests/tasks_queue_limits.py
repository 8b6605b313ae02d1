"""Tasks for the run-time queue limit tests: logged as the limit tests' tasks are."""

from __future__ import annotations

from django_sqltasks.compat import task
from tests.tasks_limits import _logged


@task(queue_name="other")
def gated(path: str, label: str, gate: str) -> str:
    """Run until the test opens ``gate``."""
    return _logged(path, label, 0.0, gate)
