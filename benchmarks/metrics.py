"""Resource sampling of a worker process tree, and the statistics the report uses."""

from __future__ import annotations

import statistics
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import psutil

RSS_INTERVAL = 0.200  # seconds between RSS samples: 5 Hz, so sampling costs the worker little
CONNECTIONS_EVERY = 1  # sample connections with every RSS sample (200 ms)


def tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants that still exist."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def vm_hwm_bytes(pid: int) -> int | None:
    """Peak resident set size of one process from ``/proc/PID/status`` (Linux only)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def tree_cpu_seconds(pid: int) -> float:
    """User plus system CPU time of the process and its descendants, so far."""
    total = 0.0
    for process in tree(pid):
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


class TreeSampler(threading.Thread):
    """Sample RSS of the whole worker tree and its connections to the given ports."""

    def __init__(self, pid: int, ports: Iterable[int]) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.ports = frozenset(ports)
        self.peak_rss = 0
        self.max_connections = 0
        self.max_processes = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        tick = 0
        while not self._stop_event.is_set():
            self.sample(with_connections=tick % CONNECTIONS_EVERY == 0)
            tick += 1
            self._stop_event.wait(RSS_INTERVAL)

    def sample(self, with_connections: bool = True) -> None:
        processes = tree(self.pid)
        rss = 0
        connections = 0
        for process in processes:
            try:
                rss += process.memory_info().rss
                if with_connections and self.ports:
                    connections += sum(
                        1
                        for c in process.net_connections(kind="tcp")
                        if c.raddr and c.raddr.port in self.ports and c.status == "ESTABLISHED"
                    )
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        self.peak_rss = max(self.peak_rss, rss)
        self.max_processes = max(self.max_processes, len(processes))
        if with_connections:
            self.max_connections = max(self.max_connections, connections)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=2)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of the repeats."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}
