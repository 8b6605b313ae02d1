"""What holds a snapshot during the middle phase: analytics sessions and a ``pg_dump``.

Analytics: overlapping sessions, one every ``gap`` seconds, each
``BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM app_account; SELECT pg_sleep(s);
COMMIT`` with ``application_name`` 'analytics-N'; ``s`` is the session length, cut so that the
last ones end with the phase. The dump: ``pg_dump`` of the whole database (plain format) whose
output is read at ``rate`` bytes/s, as a dump to slow storage or over a network is, so that it
holds its snapshot (one REPEATABLE READ transaction for the whole dump) while the phase lasts;
one that finishes early is followed by another, and the one running at the end of the phase is
read to its end at full speed.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.mixed import app

CHUNK = 8192  # bytes read from pg_dump at a time
MIN_DUMP_SECONDS = 1.0  # no new dump starts closer than this to the end of the phase


@dataclass
class Analytics:
    url: str
    seconds: float  # each session's pg_sleep, at most
    gap: float  # seconds between session starts
    sessions: list[dict[str, Any]] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)

    def run(self, until: float, stopping: threading.Event) -> None:
        """Start sessions every ``gap`` seconds until ``until`` (time.monotonic()); join them."""
        number = 0
        while not stopping.is_set() and (left := until - time.monotonic()) > 0:
            thread = threading.Thread(target=self._session, args=(number, min(self.seconds, left)))
            thread.start()
            self._threads.append(thread)
            number += 1
            stopping.wait(self.gap)
        for thread in self._threads:
            thread.join()

    def _session(self, number: int, seconds: float) -> None:
        name = f"analytics-{number}"
        record: dict[str, Any] = {"name": name, "sleep_s": round(seconds, 3)}
        started = time.monotonic()
        try:
            with psycopg.connect(self.url, application_name=name) as conn:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                record["count"] = conn.execute(app.ANALYTICS_READ).fetchone()[0]  # type: ignore[index]
                conn.execute("SELECT pg_sleep(%s)", (seconds,))
                conn.commit()
        except psycopg.Error as e:
            record["error"] = f"{e.__class__.__name__}: {e}"
        record["held_s"] = round(time.monotonic() - started, 3)
        self.sessions.append(record)


@dataclass
class Dump:
    pg_dump: Path
    url: str
    rate: float  # bytes per second read while the phase lasts
    dumps: list[dict[str, Any]] = field(default_factory=list)

    def run(self, until: float, stopping: threading.Event) -> None:
        """Dump the database over and over, read slowly, until ``until``; finish the last."""
        while not stopping.is_set() and until - time.monotonic() > MIN_DUMP_SECONDS:
            self._one(until, stopping)

    def _one(self, until: float, stopping: threading.Event) -> None:
        started = time.monotonic()
        proc = subprocess.Popen(
            [str(self.pg_dump), "--dbname", self.url, "--format", "plain"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None
        size = 0
        throttled = True
        while chunk := proc.stdout.read1(CHUNK):  # type: ignore[attr-defined]
            size += len(chunk)
            if throttled and (stopping.is_set() or time.monotonic() >= until):
                throttled = False
            if throttled:
                time.sleep(len(chunk) / self.rate)
        code = proc.wait()
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        self.dumps.append(
            {
                "bytes": size,
                "seconds": round(time.monotonic() - started, 3),
                "exit_code": code,
                **({"stderr": stderr[-500:]} if code else {}),
            }
        )
