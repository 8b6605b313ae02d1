"""Count the round trips of each path between ``enqueue()`` and a task's stored outcome, on
PostgreSQL.

Every connection goes through a counting proxy in this process (no added delay): a round trip
is a message from the client that follows the server's last one (or opens the connection), so
pipelined messages count once and a notification the server pushes counts none. Each round
trip is labelled with the statement it carries. Measured, each path alone, after warm-up:

* sync ``enqueue()`` in autocommit, and inside ``transaction.atomic()`` (whose BEGIN and
  COMMIT are the caller's, counted apart);
* ``aenqueue()``, one call at a time;
* an idle worker's path for one task: the claim after the notification, what runs between the
  claim and the task's first line (the start), and the outcome.

Usage::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/sqltasks_rt python scripts/round_trips.py \\
        [--calls 20]

The task table of that database is emptied first. Prints one table: path, round trips per
call (the median), and the statements they carry.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
CHUNK = 65536  # bytes per read


class Trace:
    """The round trips seen, per connection: (monotonic time, connection number, label)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.trips: list[tuple[float, int, str]] = []

    def mark(self) -> int:
        with self.lock:
            return len(self.trips)

    def since(self, mark: int) -> list[tuple[float, int, str]]:
        with self.lock:
            return list(self.trips[mark:])


def label(data: bytes, prepared: dict[bytes, str]) -> str:
    """What a client's message carries: the first query's first words, or a prepared one's."""
    at = 0
    found: list[str] = []
    while at + 5 <= len(data):
        kind = data[at : at + 1]
        (length,) = struct.unpack("!I", data[at + 1 : at + 5])
        body = data[at + 5 : at + 1 + length]
        if kind == b"Q":
            found.append(body.split(b"\0", 1)[0].decode(errors="replace"))
        elif kind == b"P":
            name, rest = body.split(b"\0", 1)
            query = rest.split(b"\0", 1)[0].decode(errors="replace")
            prepared[name] = query
            found.append(query)
        elif kind == b"B":
            _portal, rest = body.split(b"\0", 1)
            name = rest.split(b"\0", 1)[0]
            if not found:
                found.append(prepared.get(name, "(prepared)"))
        elif kind == b"X":
            found.append("(close)")
        elif kind in (b"\x00",) or length > len(data):  # the start-up message has no type byte
            return "(connect)"
        at += 1 + length
    text = " ".join(" ".join(found).split()) or "(other)"
    return text


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    state: dict[str, Any],
    from_client: bool,
    trace: Trace,
) -> None:
    try:
        while data := await reader.read(CHUNK):
            if from_client:
                if state["server_spoke"]:
                    with trace.lock:
                        trace.trips.append(
                            (time.monotonic(), state["number"], label(data, state["prepared"]))
                        )
                state["server_spoke"] = False
            else:
                state["server_spoke"] = True
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


def start_proxy(target: tuple[str, int], trace: Trace) -> int:
    """Serve the counting proxy on a thread; return its port."""
    ready: list[int] = []
    numbers = iter(range(1, 1_000_000))

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection(*target)
        for w in (cw, sw):
            w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state = {"server_spoke": True, "number": next(numbers), "prepared": {}}
        await asyncio.gather(_pipe(cr, sw, state, True, trace), _pipe(sr, cw, state, False, trace))

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        ready.append(server.sockets[0].getsockname()[1])
        async with server:
            await asyncio.Event().wait()

    threading.Thread(target=asyncio.run, args=(serve(),), daemon=True).start()
    while not ready:
        time.sleep(0.01)
    return ready[0]


def short(text: str) -> str:
    words = text.split()
    if "claimed AS" in text:
        return "claim" if "priorities" in text else "claim (by id)"
    if "limit_key > found.k" in text:
        return "scan of limited tasks"
    if "queuelimitoverride" in text:
        return "read of queue limit overrides"
    if "limit_key, status, backend_name" in text:
        return "limit keys enqueued since the last scan"
    if "schedulerecord" in text:
        return "scheduler tick"
    if "WITH done AS" in text:
        return "outcomes"
    if text.startswith("SELECT id FROM") and "ORDER BY" in text:
        return "the newest id (the limit scan's start)"
    return " ".join(words[:4])


def count_calls(trace: Trace, calls: int, call: Callable[[], object]) -> tuple[float, Counter[str]]:
    per_call: list[int] = []
    labels: Counter[str] = Counter()
    for _ in range(calls):
        mark = trace.mark()
        call()
        time.sleep(0.02)  # let any trailing message in
        trips = trace.since(mark)
        per_call.append(len(trips))
        labels.update(short(t[2]) for t in trips)
    return statistics.median(per_call), labels


def describe(labels: Counter[str], calls: int) -> str:
    return "; ".join(f"{name} x{n / calls:g}" for name, n in labels.most_common())


WORKER = """
import django
django.setup()
from django.core.management import call_command
call_command("tasks_worker", "--concurrency", "10", "-v", "0")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument(
        "--markdown", type=Path, help="also write the table there, as a section of a page"
    )
    options = parser.parse_args()
    url = urlsplit(os.environ["DATABASE_URL"])
    if not url.scheme.startswith("postgres"):
        raise SystemExit("DATABASE_URL must name a PostgreSQL database")
    direct_url = os.environ["DATABASE_URL"]
    trace = Trace()
    port = start_proxy((url.hostname or "127.0.0.1", url.port or 5432), trace)
    netloc = f"{url.username or 'postgres'}@127.0.0.1:{port}"
    proxied_url = urlunsplit((url.scheme, netloc, url.path, url.query, url.fragment))
    os.environ.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        DATABASE_URL=proxied_url,
        SQLTASKS_POLL_INTERVAL="5",
        SQLTASKS_HEARTBEAT_INTERVAL="10",
    )
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from django_sqltasks.models import TaskRecord
    from tests.tasks import noop, probe_latency

    call_command("migrate", "-v0")
    TaskRecord.objects.all().delete()
    rows: list[tuple[str, float, str]] = []
    calls = options.calls

    noop.enqueue()  # the connection is open and the task validated
    trips, labels = count_calls(trace, calls, noop.enqueue)
    rows.append(("sync enqueue(), autocommit", trips, describe(labels, calls)))

    def in_atomic() -> None:
        with transaction.atomic():
            noop.enqueue()

    trips, labels = count_calls(trace, calls, in_atomic)
    rows.append(("sync enqueue() in atomic() (BEGIN and COMMIT are the caller's)", trips,
                 describe(labels, calls)))  # fmt: skip

    loop = asyncio.new_event_loop()
    loop.run_until_complete(noop.aenqueue())  # its connection is open
    trips, labels = count_calls(trace, calls, lambda: loop.run_until_complete(noop.aenqueue()))
    rows.append(("aenqueue(), one at a time", trips, describe(labels, calls)))
    TaskRecord.objects.all().delete()
    connection.close()

    # The worker's path, one task after idle: enqueued on a direct connection (not counted).
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    worker = subprocess.Popen([sys.executable, "-c", WORKER], env=env, cwd=ROOT)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(30)
    udp = sock.getsockname()[1]
    enqueuer = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, django; django.setup(); from tests.tasks import probe_latency\n"
         "for line in sys.stdin: probe_latency.enqueue(int(line))"],
        env=dict(env, DATABASE_URL=direct_url), cwd=ROOT, stdin=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert enqueuer.stdin is not None
    claim: list[int] = []
    start: list[int] = []
    outcome: list[int] = []
    other: Counter[str] = Counter()
    try:
        for n in range(calls + 1):
            time.sleep(0.3)  # idle
            mark = trace.mark()
            enqueuer.stdin.write(f"{udp}\n")
            enqueuer.stdin.flush()
            sock.recv(64)
            first_line = time.monotonic()
            time.sleep(0.3)  # the outcome is written
            seen = trace.since(mark)
            if os.environ.get("ROUND_TRIPS_DEBUG"):
                for at, number, text in seen:
                    print(f"{(at - first_line) * 1000:8.2f} ms #{number} {short(text)}")
            if n == 0:
                continue  # the worker's first task: its connections were opened for it
            names = [short(t[2]) for t in seen]
            claim.append(
                sum(1 for at, _, x in seen if at < first_line and short(x).startswith("claim"))
            )
            start.append(
                sum(1 for at, _, x in seen if at < first_line and not short(x).startswith("claim"))
            )
            outcome.append(names.count("outcomes"))
            later = [short(x) for at, _, x in seen if at >= first_line]
            other.update(x for x in later if x != "outcomes")
    finally:
        enqueuer.stdin.close()
        enqueuer.wait()
        worker.terminate()
        worker.wait(timeout=30)
    rows.append(("worker: claims before the task's first line", statistics.median(claim), ""))
    rows.append(("worker: claim's return to the task's first line", statistics.median(start), ""))
    rows.append(("worker: the outcome", statistics.median(outcome), ""))
    rows.append(("worker: after the first line, besides the outcome", sum(other.values()) / calls,
                 describe(other, calls)))  # fmt: skip
    table = "| path | round trips (median) | statements, per call |\n| --- | --- | --- |\n"
    table += "".join(f"| {path} | {count:g} | {text} |\n" for path, count, text in rows)
    print(table, end="")
    if options.markdown is not None:
        options.markdown.write_text(section(table, calls))
    del probe_latency


def section(table: str, calls: int) -> str:
    """The table as a page's section: what ran, when, at which commit."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=7"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    return (
        "## Round trips of each path (PostgreSQL)\n\n"
        f"Command: `python -m benchmarks roundtrips --calls {calls}` ({when} UTC, django-sqltasks "
        f"{commit or 'unknown'}): `scripts/round_trips.py` puts a counting proxy (no added delay) "
        "between each connection and the server, and counts a round trip for each message from "
        "a client that follows the server's last one (pipelined messages count once; a "
        "notification the server pushes counts none). Each path runs alone, after a warm-up; "
        "the worker's rows are one task enqueued while it idles. At a round trip of R ms, each "
        "round trip on a path costs R ms of its latency. The last row is upkeep on the worker's "
        "database thread, off the task's path: the scan for limit keys and overrides runs at "
        "most every 0.5 s and the scheduler's tick every few seconds, whatever the number of "
        "tasks (each task here follows 0.3 s of idle, so most windows hold one scan).\n\n" + table
    )


if __name__ == "__main__":
    main()
