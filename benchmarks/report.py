"""Summaries (median and min-max of the repeats), Markdown tables and matplotlib charts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.metrics import spread
from benchmarks.systems import SYSTEMS

SMOKE_NOTE = (
    "A smoke run (300 tasks, 1 repeat, 5 probes): it checks that every system runs; its figures "
    "cannot be compared with the published ones (docs/benchmarks.md: 5,000 tasks, 3 repeats), "
    "where start-up and a single run's noise weigh far less."
)

# metric key -> (column title, formatter)
Formatter = Callable[[float], str]


def _int(v: float) -> str:
    return f"{v:,.0f}"


def _ms(v: float) -> str:
    return f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


def _pct(v: float) -> str:
    return f"{v:.2f}"


def _s(v: float) -> str:
    return f"{v:.2f}"


THROUGHPUT_COLUMNS: dict[str, tuple[str, Formatter]] = {
    "enqueue_ops": ("Enqueue ops/s", _int),
    "process_ops": ("Process ops/s", _int),
    "cold_start_s": ("Cold start s", _s),
    # The worker tree's CPU from its start to the last task, start-up included.
    "worker_cpu_us_per_task": ("Worker CPU µs/task", _ms),
    "peak_rss_mb": ("Peak RSS MB (tree)", _int),
    "parent_hwm_mb": ("VmHWM MB (parent)", _int),
    "max_connections": ("Max conns", _int),
}
LATENCY_COLUMNS: dict[str, tuple[str, Formatter]] = {
    "latency_p50_ms": ("p50 ms", _ms),
    "latency_p95_ms": ("p95 ms", _ms),
    "latency_p99_ms": ("p99 ms", _ms),
    "idle_cpu_percent": ("Idle CPU %", _pct),
}
BUSY_COLUMNS: dict[str, tuple[str, Formatter]] = {
    "latency_p50_ms": ("p50 ms", _ms),
    "latency_p95_ms": ("p95 ms", _ms),
    "latency_p99_ms": ("p99 ms", _ms),
    "probes": ("Probes", _int),
}
HTTP_COLUMNS: dict[str, tuple[str, Formatter]] = {
    "http_rps": ("Requests/s", _int),
    "http_p50_ms": ("p50 ms", _ms),
    "http_p99_ms": ("p99 ms", _ms),
}
BULK_COLUMNS: dict[str, tuple[str, Formatter]] = {
    "bulk_ops": ("enqueue_many tasks/s", _int),
    "abulk_ops": ("aenqueue_many tasks/s", _int),
    "enqueue_one_ops": ("enqueue() one at a time /s", _int),
    "orm_create_ops": ("ORM create() one at a time /s", _int),
}
FAIRNESS_COLUMNS: dict[str, tuple[str, Formatter]] = {
    "fair_others_done_s": ("fair_key: other keys done s", _s),
    "fair_others_p50_s": ("fair_key: other keys p50 s", _s),
    "fair_big_done_by_then": ("fair_key: big-key tasks done by then", _int),
    "plain_others_done_s": ("arrival order: other keys done s", _s),
    "plain_big_done_by_then": ("arrival order: big-key tasks done by then", _int),
}
WAITERS_COLUMNS: dict[str, tuple[str, Formatter]] = {
    "wait_p50_ms": ("wait(): task end to return p50 ms", _ms),
    "wait_p95_ms": ("p95 ms", _ms),
    "crowd_sessions": ("1,000 async waits: sessions", _int),
    "crowd_queries_per_s": ("their queries/s", _pct),
}
COLUMNS = {
    "noop": THROUGHPUT_COLUMNS,
    "sleep": THROUGHPUT_COLUMNS,
    "latency": LATENCY_COLUMNS,
    "busy": BUSY_COLUMNS,
    "http": HTTP_COLUMNS,
    "bulk": BULK_COLUMNS,
    "fairness": FAIRNESS_COLUMNS,
    "waiters": WAITERS_COLUMNS,
}
TITLES = {
    "noop": "NoOp",
    "sleep": "Sleep 10 ms",
    "latency": "Enqueue-to-start latency (one task at a time, idle worker)",
    "busy": "Enqueue-to-start latency, busy (one task at a time, the next 2-5 ms after)",
    "http": "End to end: async view behind uvicorn, one enqueue per request",
    "bulk": "Bulk enqueue: all the tasks in one call (systems with a bulk API)",
    "fairness": "Fairness: one key's backlog of N tasks, 50 other keys x 10 tasks, 2 workers",
    "waiters": "Waiting for results: wait() after the task's end; 1,000 async waits at once",
}


def summarize(records: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """Group the runs by scenario and system; every metric gets median, min and max."""
    rows = []
    keys = sorted({(r["scenario"], r["system"]) for r in records}, key=_order)
    for scenario, system in keys:
        runs = [r for r in records if r["scenario"] == scenario and r["system"] == system]
        ok = [r for r in runs if r["ok"]]
        row: dict[str, Any] = {
            "scenario": scenario,
            "system": system,
            "label": SYSTEMS[system].label,
            "runs": len(runs),
            "failed": len(runs) - len(ok),
            "errors": sorted({r["error"][:300] for r in runs if not r["ok"]}),
            "sleep": runs[0]["sleep"],
            "concurrency": runs[0]["concurrency"],
            "tasks": ok[0].get("tasks", ok[0].get("http_requests")) if ok else None,
            "metrics": {},
        }
        for key in COLUMNS[scenario]:
            values = [float(r[key]) for r in ok if key in r]
            if values:
                row["metrics"][key] = spread(values)
        rows.append(row)
    return {"meta": meta, "rows": rows}


def _order(key: tuple[str, str]) -> tuple[int, int]:
    scenario, system = key
    return list(COLUMNS).index(scenario), list(SYSTEMS).index(system)


def _cell(stat: dict[str, float] | None, fmt: Formatter, repeats: int) -> str:
    if stat is None:
        return "—"
    if repeats <= 1 or fmt(stat["min"]) == fmt(stat["max"]):
        return fmt(stat["median"])
    return f"{fmt(stat['median'])} ({fmt(stat['min'])}-{fmt(stat['max'])})"


def table(summary: dict[str, Any], scenario: str) -> str:
    """One Markdown table for one scenario: median (min-max) over the repeats."""
    columns = COLUMNS[scenario]
    rows = [r for r in summary["rows"] if r["scenario"] == scenario]
    if not rows:
        return ""
    extra = ["Tasks"] if scenario in ("noop", "bulk", "fairness") else []
    if scenario == "sleep":
        extra = ["Tasks", "Sleep"]
    if scenario == "http":
        extra = ["Requests"]
    header = ["System", *extra, *(title for title, _ in columns.values())]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        repeats = row["runs"] - row["failed"]
        label = (
            row["label"]
            if not row["failed"]
            else f"{row['label']} ({row['failed']} of {row['runs']} runs failed)"
        )
        cells = [label]
        if extra:
            cells.append(_int(row["tasks"]) if row["tasks"] else "—")
        if scenario == "sleep":
            cells.append(row["sleep"])
        cells += [_cell(row["metrics"].get(key), fmt, repeats) for key, (_, fmt) in columns.items()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(summary: dict[str, Any]) -> str:
    """Every table of one summary, with a heading per scenario."""
    meta = summary["meta"]
    rtt = meta.get("rtt_through_proxy_ms") or meta.get("rtt_measured_ms") or {}
    command = f"Command: `{meta['command']}`. " if meta.get("command") else ""
    method = ", ".join(
        f"{name} `{meta[key]}`"
        for name, key in (("counted by", "count"), ("logging", "logging"), ("arrival", "arrival"))
        if meta.get(key)
    )
    if method:
        command += f"Method: {method}. "
    if meta.get("started_at"):
        # Profiles of one page may come from different days: each says when and what it ran.
        commit = (meta.get("django_sqltasks") or {}).get("commit", "?")[:7]
        command += f"Run {meta['started_at']} (UTC), django-sqltasks {commit}. "
    if load := meta.get("load_average"):
        command += (
            f"Load average (1, 5, 15 min) at the start {load.get('start')}, "
            f"at the end {load.get('end', '?')}. "
        )
    if meta.get("smoke"):
        command += SMOKE_NOTE + " "
    parts = [
        f"### Profile `{meta['profile']}`: {meta['tasks']:,} tasks, {meta['repeat']} repeat(s), "
        f"requested added RTT {meta['rtt_requested_ms']:g} ms",
        "",
        command
        + "Measured round trip per service (median of 50 `SELECT 1`/`PING`): "
        + ", ".join(f"{k} {v:.3f} ms" for k, v in sorted(rtt.items())),
    ]
    for scenario in COLUMNS:
        text = table(summary, scenario)
        if text:
            parts += ["", f"#### {TITLES[scenario]}", "", text]
    return "\n".join(parts) + "\n"


def charts(summary: dict[str, Any], out: Path) -> list[Path]:
    """Bar charts with min-max whiskers: throughput per scenario, and latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profile = summary["meta"]["profile"]
    written = []
    specs = [
        (
            "throughput",
            [
                ("noop", "enqueue_ops"),
                ("noop", "process_ops"),
                ("sleep", "enqueue_ops"),
                ("sleep", "process_ops"),
            ],
            "ops/s",
        ),
        (
            "latency",
            [
                ("latency", "latency_p50_ms"),
                ("latency", "latency_p99_ms"),
                ("busy", "latency_p50_ms"),
            ],
            "ms (log scale)",
        ),
        ("memory", [("noop", "peak_rss_mb"), ("sleep", "peak_rss_mb")], "MB"),
        ("http", [("http", "http_rps")], "requests/s"),
    ]
    for name, series, unit in specs:
        panels = [
            (s, k)
            for s, k in series
            if any(r["scenario"] == s and k in r["metrics"] for r in summary["rows"])
        ]
        if not panels:
            continue
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False)
        for ax, (scenario, key) in zip(axes[0], panels, strict=True):
            rows = [r for r in summary["rows"] if r["scenario"] == scenario and key in r["metrics"]]
            names = [r["system"] for r in rows]
            med = [r["metrics"][key]["median"] for r in rows]
            low = [m - r["metrics"][key]["min"] for m, r in zip(med, rows, strict=True)]
            high = [r["metrics"][key]["max"] - m for m, r in zip(med, rows, strict=True)]
            colors = ["tab:blue" if n.startswith("sqltasks") else "tab:gray" for n in names]
            ax.barh(names, med, xerr=[low, high], color=colors, capsize=3)
            ax.invert_yaxis()
            if name == "latency":
                ax.set_xscale("log")
            ax.set_title(
                f"{TITLES[scenario].split(':')[0].split(' (')[0]} — {COLUMNS[scenario][key][0]}",
                fontsize=9,
            )
            ax.set_xlabel(unit, fontsize=8)
            ax.tick_params(labelsize=8)
        fig.suptitle(
            f"django-sqltasks benchmarks, profile {profile} (median, whiskers min-max)", fontsize=10
        )
        fig.tight_layout()
        path = out / f"{profile}-{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def write(summary: dict[str, Any], out: Path) -> None:
    """Write ``<profile>.json``, ``<profile>.md`` and the charts into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    profile = summary["meta"]["profile"]
    summary["charts"] = [p.name for p in charts(summary, out)]
    (out / f"{profile}.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / f"{profile}.md").write_text(markdown(summary))
