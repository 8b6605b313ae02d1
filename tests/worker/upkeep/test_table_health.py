"""The task table's health: read once an interval, each warning said once however many times
it is read again (none on a quiet table), and a reading that fails is survived (logged by the
heartbeat's guard) and tried at the next interval."""

from __future__ import annotations

import logging

import pytest

from django_sqltasks.worker.upkeep.table_health import TableHealth
from tests.worker.upkeep.conftest import Guard, later


def test_the_table_is_read_once_an_interval_and_each_warning_said_once(
    db: None, guard: Guard, caplog: pytest.LogCaptureFixture
) -> None:
    health = TableHealth(database="default", interval=60)
    found = {w.check_id for w in health.read()}  # e.g. W003 on a server without autovacuum
    with caplog.at_level(logging.INFO, logger="django_sqltasks"):
        health.run(guard)
        assert not health.due()
        later(health, 61)
        assert health.due()
        health.run(guard)  # the same conditions: not said again
        guard.failing = True
        later(health, 61)
        health.run(guard)
    said = [r.getMessage().split(":")[0] for r in caplog.records if r.levelno >= logging.INFO]
    assert sorted(said) == sorted(found)
    assert guard.ran == ["Reading the task table's health"] * 3
