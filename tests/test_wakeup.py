"""SQLite wake-ups: a commit by another process wakes an idle worker, watched or polled."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from django.db import connection

from django_sqltasks.worker import wakeup

pytestmark = [
    pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's wake-up"),
    pytest.mark.django_db(transaction=True),
]


def database_file() -> str:
    name = str(connection.settings_dict["NAME"])
    if not name or name == ":memory:" or name.startswith("file:"):
        pytest.skip("an in-memory test database has no file to watch")
    return name


@pytest.mark.parametrize("watched", [True, False], ids=["inotify", "polled"])
def test_a_commit_by_another_connection_wakes_the_worker(
    watched: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = database_file()
    if not watched:
        monkeypatch.setattr(wakeup, "_watch_directory", lambda path: None)
    else:
        watcher = wakeup._watch_directory(name)
        if watcher is None:
            pytest.skip("no inotify on this system")
        watcher.close()
    woken = threading.Event()
    probe = wakeup.SQLiteProbe(connection.alias, lambda queue_name: woken.set())
    probe.start()
    try:
        time.sleep(0.1)  # watching (or polling) by now
        assert not woken.is_set()
        other = sqlite3.connect(name)
        try:
            other.execute("CREATE TABLE IF NOT EXISTS wake_probe (x INTEGER)")
            other.execute("INSERT INTO wake_probe VALUES (1)")
            other.commit()
        finally:
            other.close()
        assert woken.wait(2.0), "the commit did not wake the worker"
    finally:
        probe.stop()
