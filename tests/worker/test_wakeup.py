"""SQLite wake-ups: a commit by another process wakes an idle worker, watched or polled."""

from __future__ import annotations

import sqlite3
import threading

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
    probe.start()  # its first look at the database's version is taken before start() returns
    try:
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


def test_a_write_seen_before_its_commit_is_visible_wakes_the_worker_again_when_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """inotify reports a WAL commit's write, but the commit is visible only after its fsync
    (SQLite's default ``synchronous=FULL``): a worker woken only at the write claimed too soon,
    found nothing, and waited for its next poll (10 ms or more). The wake-up thread wakes it at
    the write and again once ``PRAGMA data_version`` shows the commit."""
    name = database_file()
    wakes: list[object] = []
    probe = wakeup.SQLiteProbe(connection.alias, wakes.append)
    watching = sqlite3.connect(name, check_same_thread=False)
    other = sqlite3.connect(name)
    try:
        other.execute("CREATE TABLE IF NOT EXISTS wake_probe (x INTEGER)")
        other.commit()
        last = wakeup._data_version(watching)
        assert last is not None

        def commit_while_looking(timeout: float) -> bool:
            """The commit becomes visible between two looks, as after an fsync."""
            if not wakes[1:]:
                other.execute("INSERT INTO wake_probe VALUES (1)")
                other.commit()
            return False  # no stop

        monkeypatch.setattr(probe._stop, "wait", commit_while_looking)
        seen = probe._settle(watching, last)
        assert seen is not None and seen != last
        assert len(wakes) == 2  # at the write, and once the commit showed

        # A write that is no commit (a checkpoint, a transaction still open): one wake, at the
        # write, and none when the window ends.
        monkeypatch.setattr(probe._stop, "wait", lambda timeout: False)
        monkeypatch.setattr(wakeup, "SQLITE_SETTLE_WINDOW", 0.0)
        wakes.clear()
        assert probe._settle(watching, seen) == seen
        assert len(wakes) == 1

        # A commit already visible when its write is seen: one wake.
        other.execute("INSERT INTO wake_probe VALUES (2)")
        other.commit()
        wakes.clear()
        assert probe._settle(watching, seen) not in (None, seen)
        assert len(wakes) == 1
    finally:
        other.close()
        watching.close()
