"""The fleet profile's table: one column per shape (a lone worker, the fleet)."""

from __future__ import annotations

from typing import Any


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _n(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


ROWS: list[tuple[str, Any]] = [
    ("worker processes (machines x processes)", lambda s: (
        f"{s['worker_processes']} ({s['machines']} x {s['processes'] or 1}"
        f"{'' if s['processes'] else ', no supervisor'})"
    )),
    ("most server sessions (all clients)", lambda s: s["connections"].get("max_server_sessions")),
    ("of which the web app's share, held open", lambda s: s["connections"].get("max_web")),
    ("of which a supervisor's LISTEN (its last statement)", lambda s: s["connections"].get(
        "max_listening")),
    ("workers' connections straight to the server, most", lambda s: s["connections"].get(
        "max_workers_direct")),
    ("workers' connections to PgBouncer, most", lambda s: s["connections"].get(
        "max_workers_pooled")),
    ("most connections one process holds", lambda s: s["connections"].get("max_most_one_process")),
    ("idle fleet: claims per second (polls)", lambda s: _n(s["probes"]["idle_claims_per_s"], 1)),
    ("one enqueue, idle fleet: claims it causes", lambda s: _n(s["probes"]["claims_per_probe"])),
    ("one enqueue, idle fleet: start p50 / p99 ms", lambda s: (
        f"{_ms(s['probes']['p50_ms'])} / {_ms(s['probes']['p99_ms'])}"
    )),
    ("steady: tasks enqueued / done", lambda s: f"{s['steady']['enqueued']:,} / "
        f"{s['steady']['done']:,}"),
    ("steady: enqueue rate achieved, tasks/s", lambda s: _n(s["steady"]["enqueuer"]["rate"], 1)),
    ("steady: start p50 / p99 ms", lambda s: (
        f"{_ms(s['steady']['p50_ms'])} / {_ms(s['steady']['p99_ms'])}"
    )),
    ("steady: server CPU per task, ms", lambda s: _n(s["steady"]["server_cpu_ms_per_task"])),
    ("steady: workers' CPU per task, ms", lambda s: _n(s["steady"]["worker_cpu_ms_per_task"])),
    ("steady: claims per task", lambda s: _n(s["steady"]["claims_per_task"])),
    ("steady: claims that found nothing, per task (at least)", lambda s: _n(
        s["steady"]["empty_claims_at_least"] / s["steady"]["done"] if s["steady"]["done"]
        else None)),
]  # fmt: skip


def markdown(result: dict[str, Any], heading: str = "###") -> str:
    meta = result["meta"]
    shapes = result["shapes"]
    core = meta.get("core", {})
    changed = core.get("worktree_dirty") and core.get("ref") == "worktree"
    dirty = " (working tree changed)" if changed else ""
    lines = [
        f"{heading} Profile `{meta['profile']}`",
        "",
        f"Command: `{meta['command']}`. Run {meta['started_at']} (UTC), django-sqltasks "
        f"{str(core.get('commit', ''))[:12]}{dirty}, PostgreSQL "
        f"{next(iter(shapes.values()), {}).get('server_version', '?')} (a private server, "
        f"max_connections = {meta['max_connections']}, pg_stat_statements), PgBouncer in "
        f"transaction mode with {meta['pool_size']} server connections, {meta['web']} "
        f"connections of a web app held open; concurrency {meta['concurrency']} a process; "
        f"{meta['probes']} probes, then {meta['rate']:g} tasks/s for {meta['seconds']:g} s. "
        f"`uptime` before and after: {meta.get('uptime_before')}; {meta.get('uptime_after')}.",
        "",
        "| | " + " | ".join(shapes) + " |",
        "|---|" + "---|" * len(shapes),
    ]
    for label, cell in ROWS:
        values = []
        for shape in shapes.values():
            try:
                value = cell(shape)
            except (KeyError, TypeError, ZeroDivisionError):
                value = None
            values.append("-" if value is None else str(value))
        lines.append(f"| {label} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"
