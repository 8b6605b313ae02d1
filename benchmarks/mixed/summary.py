"""The figures of one run of the ``mixed`` profile: per phase and per system, from every task's
report, the enqueue times and the per-second samples; the table, the checks of issue 44's
"done when", and the chart.

Windows are 10 s long, counted from the start of their phase; a task belongs to the window (and
the phase) in which its body started, and its start latency is that start minus the moment just
before its enqueue call. The backlog at a moment is the tasks enqueued by then whose body had not
started; the oldest waiting is the age of the oldest of them, a lower bound on latencies that
have not been measured yet.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.metrics import percentile

WINDOW = 10.0  # seconds
GRID = 0.5  # seconds between the moments the backlog is evaluated at
SAMPLE_SPAN = 1.0  # seconds between the samples the series are drawn from
PHASES = ("baseline", "held", "recovery")
PHASE_LABELS = {"baseline": "baseline", "held": "snapshots held", "recovery": "recovery"}
MIB = 1024 * 1024
REFERENCE = "classic"  # the system the others' server CPU per task is compared with


def system_figures(
    enqueued: Sequence[float],
    tasks: Sequence[tuple[int, float, float, float]],
    samples: list[dict[str, Any]],
    phases: dict[str, tuple[float, float]],
    hot_table: str,
) -> dict[str, Any]:
    """Everything the report shows of one system: per phase, the series, what was lost."""
    started = [math.inf] * len(enqueued)
    ended: list[float] = []
    for seq, _enq, start, end in tasks:
        if 0 <= seq < len(started):
            started[seq] = start
            ended.append(end)
    starts = sorted(s for s in started if s != math.inf)
    ended.sort()
    first, last = phases["baseline"][0], max(end for _, end in phases.values())
    grid = _backlog(enqueued, started, starts, first, last)
    by_start = sorted((s, s - e) for s, e in zip(started, enqueued, strict=True) if s != math.inf)
    result: dict[str, Any] = {"phases": {}, "lost": len(enqueued) - len(starts)}
    # The sample that closed the start (the worker up, nothing enqueued yet).
    previous = next((s for s in reversed(samples) if s["phase"] == "start"), None)
    for name, (begin, end) in phases.items():
        in_phase = [s for s in samples if s["phase"] == name]
        figures = _phase(begin, end, enqueued, by_start, ended, grid, in_phase, previous, hot_table)
        result["phases"][name] = figures
        previous = in_phase[-1] if in_phase else previous
    result["series"] = _series(grid, by_start, samples, first, hot_table)
    return result


def _backlog(
    enqueued: Sequence[float], started: list[float], starts: list[float], first: float, last: float
) -> list[tuple[float, int, float]]:
    """(moment, backlog, oldest waiting s) every GRID seconds; ``enqueued`` is in seq order."""
    out = []
    oldest = 0  # the first seq that may still be waiting: every one before it has started
    t = first
    while t <= last:
        count = bisect.bisect_right(enqueued, t) - bisect.bisect_right(starts, t)
        while oldest < len(enqueued) and started[oldest] <= t:
            oldest += 1
        waiting = t - enqueued[oldest] if oldest < len(enqueued) and enqueued[oldest] <= t else 0.0
        out.append((t, count, waiting))
        t += GRID
    return out


def _windows(begin: float, end: float) -> list[tuple[float, float]]:
    edges = []
    t = begin
    while t < end - 1e-9:
        edges.append((t, min(t + WINDOW, end)))
        t += WINDOW
    return edges


def _in(sorted_pairs: list[tuple[float, float]], begin: float, end: float) -> list[float]:
    low = bisect.bisect_left(sorted_pairs, (begin, -math.inf))
    high = bisect.bisect_left(sorted_pairs, (end, -math.inf))
    return [latency for _, latency in sorted_pairs[low:high]]


def _count(values: list[float], begin: float, end: float) -> int:
    return bisect.bisect_left(values, end) - bisect.bisect_left(values, begin)


def _phase(
    begin: float,
    end: float,
    enqueued: Sequence[float],
    by_start: list[tuple[float, float]],
    ended: list[float],
    grid: list[tuple[float, int, float]],
    samples: list[dict[str, Any]],
    previous: dict[str, Any] | None,
    hot_table: str,
) -> dict[str, Any]:
    seconds = end - begin
    latencies = _in(by_start, begin, end)
    windows = []
    for w_begin, w_end in _windows(begin, end):
        w_latencies = _in(by_start, w_begin, w_end)
        windows.append(
            {
                "p99_ms": percentile(w_latencies, 99) * 1000 if w_latencies else None,
                "completed_per_s": _count(ended, w_begin, w_end) / (w_end - w_begin),
                "enqueued_per_s": _count(list(enqueued), w_begin, w_end) / (w_end - w_begin),
                "backlog_max": max((b for t, b, _ in grid if w_begin <= t < w_end), default=0),
            }
        )
    full = [
        w for w, (a, b) in zip(windows, _windows(begin, end), strict=True) if b - a >= WINDOW / 2
    ]
    in_grid = [(b, age) for t, b, age in grid if begin <= t < end]
    figures: dict[str, Any] = {
        "seconds": seconds,
        "enqueued_per_s": _count(list(enqueued), begin, end) / seconds,
        "started": len(latencies),
        "completed_per_s": _count(ended, begin, end) / seconds,
        "completed_per_s_worst_window": min((w["completed_per_s"] for w in full), default=None),
        # Completions against the arrivals of the same window: an enqueuer that falls behind
        # its schedule (a loaded machine) slows completions too, and that is not the queue's.
        "pace_worst_window": min(
            (w["completed_per_s"] / w["enqueued_per_s"] for w in full if w["enqueued_per_s"]),
            default=None,
        ),
        "backlog_max": max((b for b, _ in in_grid), default=0),
        "oldest_waiting_max_s": max((age for _, age in in_grid), default=0.0),
        "latency_p50_ms": percentile(latencies, 50) * 1000 if latencies else None,
        "latency_p99_ms": percentile(latencies, 99) * 1000 if latencies else None,
        "latency_max_ms": max(latencies) * 1000 if latencies else None,
        "latency_p99_worst_window_ms": max(
            (w["p99_ms"] for w in windows if w["p99_ms"] is not None), default=None
        ),
        "windows": windows,
    }
    if samples:
        # The CPU counters' span: from the sample that closed the phase before to this one's last.
        completed = _count(ended, previous["t"] if previous else begin, samples[-1]["t"])
        figures |= _from_samples(samples, previous, hot_table, completed)
    return figures


def _from_samples(
    samples: list[dict[str, Any]],
    previous: dict[str, Any] | None,
    hot_table: str,
    completed: int,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in samples[-1]["statements"]:
        calls = sum(s["statements"][kind]["calls"] for s in samples)
        ms = sum(s["statements"][kind]["ms"] for s in samples)
        buffers = sum(s["statements"][kind]["buffers"] for s in samples)
        seconds = samples[-1]["t"] - (previous["t"] if previous else samples[0]["t"])
        out[kind] = {
            "calls": calls,
            "calls_per_s": calls / seconds if seconds > 0 else None,
            "mean_ms": ms / calls if calls else None,
            "max_ms": max(s["statements"][kind]["phase_max_ms"] for s in samples),
            "ms_per_s": ms / seconds if seconds > 0 else None,
            "buffers_per_call": buffers / calls if calls else None,
        }
    hot = [s[hot_table] for s in samples if hot_table in s]
    if hot:
        first = previous[hot_table] if previous and hot_table in previous else hot[0]
        out["dead_max"] = max(h["dead"] for h in hot)
        out["live_max"] = max(h["live"] for h in hot)
        out["table_mib_max"] = max(h["table_bytes"] for h in hot) / MIB
        out["index_mib_max"] = max(h["index_bytes"] for h in hot) / MIB
        out["autovacuums"] = hot[-1]["autovacuums"] - first["autovacuums"]
    ages = [float(s["horizon"]["seconds"]) for s in samples if s["horizon"]["seconds"] is not None]
    out["oldest_snapshot_s_max"] = max(ages, default=None)
    held_by = {s["horizon"]["holder"] for s in samples if float(s["horizon"]["seconds"] or 0) > 5}
    out["horizon_holders"] = sorted(h for h in held_by if h)  # who held it over 5 s
    loads = [s["load1"] for s in samples]
    out["load1_min"], out["load1_max"] = min(loads), max(loads)
    if previous is not None and completed:
        if "server_cpu_s" in samples[-1] and "server_cpu_s" in previous:  # not a shared server's
            server = samples[-1]["server_cpu_s"] - previous["server_cpu_s"]
            out["server_cpu_ms_per_task"] = server / completed * 1000
        if "worker_cpu_s" in samples[-1] and "worker_cpu_s" in previous:
            worker = samples[-1]["worker_cpu_s"] - previous["worker_cpu_s"]
            out["worker_cpu_ms_per_task"] = worker / completed * 1000
    return out


def _series(
    grid: list[tuple[float, int, float]],
    by_start: list[tuple[float, float]],
    samples: list[dict[str, Any]],
    first: float,
    hot_table: str,
) -> dict[str, list[Any]]:
    """At each sample: the backlog's max since the last, the p99 of the 10 s ending then, the
    dead versions, the claim's mean ms since the last."""
    series: dict[str, list[Any]] = {
        "t": [],
        "backlog": [],
        "p99_ms": [],
        "dead": [],
        "claim_ms": [],
    }
    moments = [t for t, _, _ in grid]
    for sample in samples:
        t = sample["t"]
        series["t"].append(round(t - first, 1))
        since = grid[
            bisect.bisect_right(moments, t - SAMPLE_SPAN) : bisect.bisect_right(moments, t)
        ]
        series["backlog"].append(max((b for _, b, _ in since), default=None))
        recent = _in(by_start, t - WINDOW, t)
        series["p99_ms"].append(round(percentile(recent, 99) * 1000, 2) if recent else None)
        series["dead"].append(sample.get(hot_table, {}).get("dead"))
        claim = sample["statements"].get("claim", {})
        calls = claim.get("calls", 0)
        series["claim_ms"].append(round(claim["ms"] / calls, 3) if calls else None)
    return series


# The table ---------------------------------------------------------------------------------


def _n(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    if abs(value) >= 100 or digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 10_000:
        return f"{value / 1000:,.1f} s"
    return f"{value:,.1f} ms" if value < 100 else f"{value:,.0f} ms"


def _statement(p: dict[str, Any], kind: str) -> dict[str, Any]:
    return p.get(kind) or {}


def _cost(p: dict[str, Any], kind: str) -> str:
    """A statement's mean time and buffers (shared, hit or read) per call."""
    figures = _statement(p, kind)
    return f"{_ms(figures.get('mean_ms'))}; {_n(figures.get('buffers_per_call'), 1)}"


def _claims(p: dict[str, Any]) -> str:
    claim = _statement(p, "claim")
    mean, most = _ms(claim.get("mean_ms")), _ms(claim.get("max_ms"))
    return f"{_n(claim.get('calls_per_s'), 1)}; {mean} / {most}"


def _latency(p: dict[str, Any]) -> str:
    p50, p99 = _ms(p["latency_p50_ms"]), _ms(p["latency_p99_ms"])
    return f"{p50} / {p99}; {_ms(p['latency_p99_worst_window_ms'])}"


def _sizes(p: dict[str, Any]) -> str:
    table, indexes = _n(p.get("table_mib_max"), 2), _n(p.get("index_mib_max"), 2)
    return f"{table} / {indexes}; {p.get('autovacuums', '—')}"


def _snapshot(p: dict[str, Any]) -> str:
    age = p.get("oldest_snapshot_s_max")
    return "—" if age is None else f"{max(float(age), 0.0):.0f} s"


def _load(p: dict[str, Any]) -> str:
    return f"{p['load1_min']:.1f}-{p['load1_max']:.1f}" if "load1_min" in p else "—"


ROWS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("enqueued per s (achieved)", lambda p: _n(p["enqueued_per_s"], 1)),
    (
        "backlog max (tasks due, not started); oldest waiting",
        lambda p: f"{_n(p['backlog_max'])}; {p['oldest_waiting_max_s']:.1f} s",
    ),
    ("start latency p50 / p99; worst 10 s p99", _latency),
    (
        "completed per s: mean; worst 10 s",
        lambda p: f"{_n(p['completed_per_s'], 1)}; {_n(p['completed_per_s_worst_window'], 1)}",
    ),
    ("claim statement: calls per s; mean / max", _claims),
    (
        "claim: buffers per call; ms of claims per s",
        lambda p: (
            f"{_n(_statement(p, 'claim').get('buffers_per_call'), 1)}; "
            f"{_n(_statement(p, 'claim').get('ms_per_s'), 1)}"
        ),
    ),
    ("finish statement: mean; buffers per call", lambda p: _cost(p, "finish")),
    ("enqueue statement: mean; buffers per call", lambda p: _cost(p, "enqueue")),
    ("the task's app write: mean; buffers per call", lambda p: _cost(p, "app_write")),
    (
        "dead row versions of the hot table, max; live max",
        lambda p: f"{_n(p.get('dead_max'))}; {_n(p.get('live_max'))}",
    ),
    ("hot table / its indexes, max MiB; autovacuums", _sizes),
    ("oldest snapshot, max age", _snapshot),
    (
        "server CPU per task; worker CPU per task",
        lambda p: f"{_ms(p.get('server_cpu_ms_per_task'))}; {_ms(p.get('worker_cpu_ms_per_task'))}",
    ),
    ("load average (1 min), min-max", _load),
]


def checks(result: dict[str, Any], system: str) -> list[tuple[str, str, bool | None]]:
    """Issue 44's "done when", measured: (what, the figure, met)."""
    phases = result["systems"][system]["phases"]
    base, held, rec = phases["baseline"], phases["held"], phases["recovery"]
    rate = result["meta"]["rate"]
    out: list[tuple[str, str, bool | None]] = []
    limit = 2 * rate
    out.append(
        (
            "backlog never exceeds 2 s of arrivals",
            f"{held['backlog_max']:,} held, {rec['backlog_max']:,} after (limit {limit:,.0f})",
            max(held["backlog_max"], rec["backlog_max"]) <= limit,
        )
    )
    base_p99 = base["latency_p99_ms"]
    worst = held["latency_p99_worst_window_ms"]
    if base_p99 is not None and worst is not None:
        bound = min(3 * base_p99, 100.0)
        out.append(
            (
                "every 10 s p99 within 3x the baseline's and under 100 ms",
                f"worst {_ms(worst)} against {_ms(bound)} (baseline p99 {_ms(base_p99)})",
                worst <= bound,
            )
        )
    pace = held.get("pace_worst_window")
    if pace is not None:
        out.append(
            (
                "completions keep pace (every 10 s, at least 90% of that window's arrivals)",
                f"worst {pace:.0%} ({held['completed_per_s_worst_window']:,.1f} completed per s)",
                pace >= 0.9,
            )
        )
    back = recovered_after(result["systems"][system])
    out.append(
        (
            "back to baseline within 60 s of the last snapshot",
            "not in the recovery phase" if back is None else f"after {back:.0f} s",
            back is not None and back <= 60,
        )
    )
    b0, b1 = (
        _statement(base, "claim").get("buffers_per_call"),
        _statement(held, "claim").get("buffers_per_call"),
    )
    if b0 and b1:
        out.append(
            (
                "buffers per claim within 3x the baseline's",
                f"{b1:,.1f} against {b0:,.1f} ({b1 / b0:.1f}x)",
                b1 <= 3 * b0,
            )
        )
    mine = base.get("server_cpu_ms_per_task")
    if system != REFERENCE and REFERENCE in result["systems"] and mine:
        theirs = result["systems"][REFERENCE]["phases"]["baseline"].get("server_cpu_ms_per_task")
        if theirs:
            out.append(
                (
                    "server CPU per task with nothing held within 2x the classic table's",
                    f"{mine:.2f} ms against {theirs:.2f} ms ({mine / theirs:.1f}x)",
                    mine <= 2 * theirs,
                )
            )
    return out


def recovered_after(system: dict[str, Any]) -> float | None:
    """Seconds from the end of the held phase to the start of the first recovery window from
    which every window's backlog and p99 are within the baseline's worst."""
    base, rec = system["phases"]["baseline"], system["phases"]["recovery"]
    backlog_bound = max(w["backlog_max"] for w in base["windows"])
    p99_bound = base["latency_p99_worst_window_ms"] or 0.0
    windows = rec["windows"]
    for i in range(len(windows)):
        if all(
            w["backlog_max"] <= backlog_bound and (w["p99_ms"] or 0.0) <= p99_bound
            for w in windows[i:]
        ):
            return i * WINDOW
    return None


def markdown(result: dict[str, Any], heading: str = "###") -> str:
    meta = result["meta"]
    lines = [
        f"{heading} Profile `{meta['profile']}`: {meta['rate']:g} tasks/s, snapshots held by "
        + ", ".join(meta["hold"]),
        "",
        f"Command: `{meta['command']}`. Run {meta['started_at']} (UTC), django-sqltasks "
        f"{meta['commit'][:12]}{' with uncommitted changes' if meta.get('dirty') else ''}, "
        f"PostgreSQL {meta['server_version']} (a private server: autovacuum {meta['autovacuum']}, "
        f"{meta['statements_source']}). Phases: baseline {meta['seconds']['baseline']:g} s, "
        f"snapshots held {meta['seconds']['held']:g} s, "
        f"recovery {meta['seconds']['recovery']:g} s; "
        f"one worker at concurrency {meta['concurrency']}. `uptime` before and after: "
        f"{meta['uptime_before']}; {meta['uptime_after']}.",
        "",
    ]
    for name, system in result["systems"].items():
        lines += [
            f"**{system['label']}**"
            + (
                f": {system['lost']:,} tasks not started by the end of the drain"
                if system["lost"]
                else ""
            ),
            "",
            "| | " + " | ".join(PHASE_LABELS[p] for p in PHASES) + " |",
            "|---|" + "---|" * len(PHASES),
        ]
        for label, cell in ROWS:
            lines.append(
                f"| {label} | " + " | ".join(cell(system["phases"][p]) for p in PHASES) + " |"
            )
        lines.append("")
        holders = system.get("holders", {})
        if holders.get("dumps"):
            dumps = holders["dumps"]
            lines.append(
                f"pg_dump: {len(dumps)} dump(s), "
                + ", ".join(
                    f"{d['bytes'] / MIB:.1f} MiB in {d['seconds']:.0f} s (exit {d['exit_code']})"
                    for d in dumps
                )
                + "."
            )
        if holders.get("sessions"):
            longest = max(s["held_s"] for s in holders["sessions"])
            lines.append(
                f"Analytics sessions: {len(holders['sessions'])}, the longest held {longest:.0f} s."
            )
        unmatched = [
            PHASE_LABELS[p]
            for p in PHASES
            if system["phases"][p]["started"]
            and not _statement(system["phases"][p], "claim").get("calls")
        ]
        if unmatched:
            text = system.get("statement_kinds", {}).get("claim")
            lines.append(
                f"No statement in pg_stat_statements contained the claim's text {text!r} in "
                f"{', '.join(unmatched)}, though tasks started: the claim figures are missing "
                "(--claim-match gives the text of a claim that changed)."
            )
        warnings = system.get("worker_warnings")
        if warnings:
            lines.append(
                "Worker log: "
                + ", ".join(f"{code} x{n}" for code, n in sorted(warnings.items()))
                + "."
            )
        lines += ["", 'Issue 44\'s "done when", measured:', ""]
        for what, figure, met in checks(result, name):
            lines.append(f"- {'met' if met else 'NOT met'}: {what}: {figure}")
        lines.append("")
    return "\n".join(lines)


# The chart ---------------------------------------------------------------------------------


PANELS = [  # series key, axis label, scale
    ("backlog", "backlog (tasks)", "symlog"),
    ("p99_ms", "p99 start latency, last 10 s (ms)", "log"),
    ("dead", "dead row versions, hot table", "symlog"),
    ("claim_ms", "claim statement, mean (ms)", "log"),
]


def chart(result: dict[str, Any], path: Path, panels: list[tuple[str, str, str]] = PANELS) -> None:
    """Backlog, window p99, dead versions and claim time over time (or ``panels``), every
    system on each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(panels), 1, figsize=(9, 10), sharex=True)
    meta = result["meta"]
    held_from = meta["seconds"]["baseline"]
    held_to = held_from + meta["seconds"]["held"]
    for axis, (key, label, scale) in zip(axes, panels, strict=True):
        for system in result["systems"].values():
            series = system["series"]
            points = [
                (t, v) for t, v in zip(series["t"], series[key], strict=True) if v is not None
            ]
            if points:
                axis.plot(*zip(*points, strict=True), label=system["label"], linewidth=1.2)
        axis.axvspan(held_from, held_to, color="grey", alpha=0.15, linewidth=0)
        axis.set_ylabel(label, fontsize=8)
        axis.set_yscale(scale)
        axis.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper left")
    axes[0].set_title(
        f"{meta['profile']}: {meta['rate']:g} tasks/s; shaded: snapshots held by "
        + ", ".join(meta["hold"]),
        fontsize=9,
    )
    axes[-1].set_xlabel("seconds since the first enqueue")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)
