"""Tasks for the limit tests: each appends its start and end to a log file."""

from __future__ import annotations

import os
import time
from pathlib import Path

from django_sqltasks.compat import task
from tests import events


def _logged(path: str, label: str, seconds: float, gate: str | None = None) -> str:
    """Append "start"/"end" lines with times to ``path`` around a sleep of ``seconds`` (or a
    wait at the test's ``gate``); tell the test of the start (a ``note``)."""
    with Path(path).open("a") as f:
        f.write(f"start {label} {time.time():.6f} {os.getpid()}\n")
    events.note("start", label=label)
    time.sleep(seconds)
    if gate is not None:
        events.wait_at(gate)
    with Path(path).open("a") as f:
        f.write(f"end {label} {time.time():.6f} {os.getpid()}\n")
    return label


@task(concurrency_limit=2)
def two_at_once(path: str, label: str, seconds: float = 0.0) -> str:
    return _logged(path, label, seconds)


@task(
    concurrency_limit=1,
    concurrency_key=lambda path, customer, label, seconds=0.0, gate=None: customer,
)
def one_per_customer(
    path: str, customer: str, label: str, seconds: float = 0.0, gate: str | None = None
) -> str:
    return _logged(path, f"{customer}:{label}", seconds, gate)


@task(rate_limit="3/s")
def three_a_second(path: str, label: str) -> str:
    return _logged(path, label, 0.0)


@task(concurrency_limit=1, rate_limit="100/h")
def one_and_hundred_an_hour(path: str, label: str) -> str:
    return _logged(path, label, 0.0)


@task(queue_name="other")
def in_other_queue(path: str, label: str, seconds: float = 0.0) -> str:
    return _logged(path, label, seconds)


@task
def unlimited(path: str, label: str) -> str:
    return _logged(path, label, 0.0)


def intervals(path: Path) -> list[tuple[float, float, str]]:
    """(start, end, label) of each finished run in ``path``."""
    starts: dict[str, float] = {}
    spans = []
    for line in path.read_text().splitlines() if path.exists() else []:
        kind, label, at, _ = line.split()
        if kind == "start":
            starts[label] = float(at)
        else:
            spans.append((starts.pop(label), float(at), label))
    return spans


def most_at_once(spans: list[tuple[float, float, str]]) -> int:
    """The most spans open at one instant (an end before a start at the same time)."""
    events = sorted([(s, 1) for s, _, _ in spans] + [(e, -1) for _, e, _ in spans])
    current = peak = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def undecorated() -> None:
    """A module-level function for tests that decorate it with bad options."""
