"""Test signals: moments of a worker's run that a test can wait on instead of a clock.

A test sets ``listener`` (its worker processes set it from their settings); production sets
nothing, and each signal then costs one call and a None check, at moments that come once a
heartbeat or once a process (a worker registers, a supervisor starts or loses a child), never
once a task. Tasks' starts and ends need no signal here: ``task_started`` and ``task_finished``
tell them. River's ``TestSignals`` are the model.

The signals, and their fields (all JSON values):

- ``registered``: a worker took its lease (``worker_id``); it claims next.
- ``worker_started``: a worker is up (``worker_id``): registered, listening for wake-ups, its
  heartbeat running; it claims next.
- ``stopping``: a worker asked to stop has put back the tasks it had claimed but not started
  (``worker_id``); it waits for its ``running`` tasks.
- ``scheduling_stopped``: a stopping worker's periodic thread ended, with no slot enqueued
  since (``worker_id``).
- ``scheduler_tick``: a worker's periodic thread read the schedule table and enqueued the due
  slots (``worker_id``, ``fired``: the names of the schedules it enqueued, or None if the tick
  failed).
- ``listening``: a PostgreSQL worker's loop connection listens for new tasks (``worker_id``),
  at its start and each time it comes back.
- ``rescue_pass``: a worker looked for the tasks of dead workers (``worker_id``, ``count``
  rescued), at its registration and at each heartbeat.
- ``child_started``: a supervisor started a worker process (``worker_id``, ``pid``).
- ``child_died``: a worker process died on its own, its tasks were rescued, and a replacement
  is due in ``delay`` seconds (``worker_id``, ``pid``, ``status``, ``delay``).
- ``child_killed``: a supervisor killed a worker process for ``tasks`` past their timeout or
  cancelled, and wrote their outcomes (``worker_id``, ``pid``, ``tasks``, ``action``).
- ``relay_listening``: a supervisor's ``LISTEN`` connection is up (``database``, ``slot``: its
  place in the wake ring, ``head``: whether it hears every enqueue).
- ``relay_head``: a supervisor took the head of its wake ring (``database``, ``slot``).
- ``ring_changed``: a supervisor saw the slots of its wake ring change (``database``, ``slot``,
  ``slots``).
- ``relay_woke``: a supervisor woke one of its processes for a notification or a "more"
  (``worker_id``, ``queue``, ``hops``: the machines that passed it on before); once a
  wake-up, which is at most once a task.
- ``wake_passed``: a supervisor with no room passed a wake-up to the next slot of its ring
  (``slot``, ``to``, ``hops``, ``queue``).
- ``leases_renewed``: a supervisor renewed its healthy children's leases (``worker_ids``).
- ``health_touched``: a worker or a supervisor touched its health file (``path``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("django_sqltasks")

Listener = Callable[[str, dict[str, Any]], None]

# Called with each signal's name and fields on the thread where it happened. Set before the
# worker starts and cleared after it stops (by a test); read from any thread.
listener: Listener | None = None


def emit(name: str, **fields: Any) -> None:
    """Tell the listener, if one is set, that ``name`` happened; never raise."""
    hook = listener
    if hook is None:
        return
    try:
        hook(name, fields)
    except Exception:
        logger.exception("The test listener failed on signal %s", name)
