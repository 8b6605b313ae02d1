"""The project's speed targets, read from the profiles on the page.

Each target names the profile, scenario and metric it is read from, and what it is held
against in the same run (django-vtasks, or a floor: the raw SQL row or the bare-SQL floor), so
the page shows each figure beside the one it is compared with, the gap, and where
docs/performance.md explains what is left. A profile that was not run reads "not measured".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from benchmarks.systems import SYSTEMS

# How the figure is held against its bound:
# ratio: figure / the other system's >= bound; least / most: figure >= / <= bound;
# gap: figure - the other system's <= bound (milliseconds over a floor).
Rule = Literal["ratio", "least", "most", "gap"]
PERFORMANCE = "performance.md"
# The sections of docs/performance.md the targets point to, by their anchors.
SECTIONS = {
    "the-worker-per-task": "The worker, per task",
    "start-up": "Start-up",
    "enqueue-to-start-latency": "Enqueue-to-start latency",
    "enqueue": "Enqueue",
}


@dataclass(frozen=True)
class Target:
    text: str
    profile: str
    scenario: str
    metric: str
    rule: Rule
    bound: float
    against: str | None = None  # the system of the same run the figure is held against
    system: str = "sqltasks-pg"
    explained: str = ""  # the section of docs/performance.md that says where the time goes


def _versus_vtasks(text: str, profile: str, metric: str, bound: float, explained: str) -> Target:
    return Target(
        text, profile, "noop", metric, "ratio", bound, "vtasks-valkey", explained=explained
    )


def _latency(text: str, profile: str, scenario: str, rule: Rule, bound: float, **kw: str) -> Target:
    return Target(text, profile, scenario, "latency_p50_ms", rule, bound, **kw)


LATENCY = "enqueue-to-start-latency"
TARGETS = (
    _versus_vtasks(
        "NoOp 50,000: >= 3x django-vtasks", "local-50k", "process_ops", 3, "the-worker-per-task"
    ),
    Target(
        "NoOp 50,000: >= 18,000 tasks/s",
        "local-50k",
        "noop",
        "process_ops",
        "least",
        18000,
        "raw-sql",
        explained="the-worker-per-task",
    ),
    Target(
        "NoOp 50,000: worker CPU <= 25 µs a task",
        "local-50k",
        "noop",
        "worker_cpu_us_per_task",
        "most",
        25,
        "raw-sql",
        explained="the-worker-per-task",
    ),
    _versus_vtasks("NoOp 5,000: >= 2x django-vtasks", "local", "process_ops", 2, "start-up"),
    _latency(
        "p50 after idle: <= the bare-SQL floor + 0.3 ms",
        "local",
        "latency",
        "gap",
        0.3,
        against="sql-floor",
        explained=LATENCY,
    ),
    _latency(
        "p50 busy: <= the bare-SQL floor + 0.2 ms",
        "local",
        "busy",
        "gap",
        0.2,
        against="sql-floor",
        explained=LATENCY,
    ),
    _latency(
        "p50 after idle, SQLite: <= 1.5 ms",
        "local",
        "latency",
        "most",
        1.5,
        system="sqltasks-sqlite",
        explained=LATENCY,
    ),
    _latency(
        "p50 at a 2 ms round trip: <= the bare-SQL floor",
        "rtt-2ms",
        "latency",
        "gap",
        0,
        against="sql-floor",
        explained=LATENCY,
    ),
    _versus_vtasks(
        "`aenqueue`, 5,000 (lanes): >= 2x django-vtasks", "local", "enqueue_ops", 2, "enqueue"
    ),
    _versus_vtasks(
        "`aenqueue`, 50,000 (lanes): >= 2x django-vtasks", "local-50k", "enqueue_ops", 2, "enqueue"
    ),
    _versus_vtasks(
        "`aenqueue`, 5,000 (`Semaphore(200)`): >= 2x", "semaphore", "enqueue_ops", 2, "enqueue"
    ),
    _versus_vtasks(
        "`aenqueue`, 50,000 (`Semaphore(200)`): >= 2x", "semaphore-50k", "enqueue_ops", 2, "enqueue"
    ),
)


def _metric(
    summaries: dict[str, dict[str, Any]], target: Target, system: str
) -> dict[str, float] | None:
    summary = summaries.get(target.profile)
    if summary is None:
        return None
    for row in summary["rows"]:
        if row["scenario"] == target.scenario and row["system"] == system:
            stat: dict[str, float] | None = row["metrics"].get(target.metric)
            return stat
    return None


def _number(value: float, metric: str) -> str:
    if metric.endswith("_ms"):
        return f"{value:.1f} ms"
    if metric.endswith("_us_per_task"):
        return f"{value:.1f} µs"
    return f"{value:,.0f}/s"


def _figure(stat: dict[str, float], metric: str) -> str:
    text = _number(stat["median"], metric)
    bare = [_number(stat[k], metric).split(" ")[0].removesuffix("/s") for k in ("min", "max")]
    return text if bare[0] == bare[1] else f"{text} ({bare[0]}-{bare[1]})"


def _verdict(target: Target, mine: float, theirs: float | None) -> tuple[str, bool | None]:
    """The comparison's text and whether the target is met (None: nothing to compare)."""
    if target.rule == "ratio":
        if not theirs:
            return "—", None
        ratio = mine / theirs
        return f"{ratio:.2f}x", ratio >= target.bound
    if target.rule == "gap":
        if theirs is None:
            return "—", None
        gap = mine - theirs
        return f"{gap:+.1f} ms", gap <= target.bound
    if target.rule == "least":
        return "", mine >= target.bound
    return "", mine <= target.bound


def section(summaries: list[dict[str, Any]]) -> str:
    """The targets' table, from the summaries of the page's profiles."""
    by_profile = {s["meta"]["profile"]: s for s in summaries}
    lines = [
        "## The speed targets, from the profiles below",
        "",
        "Each target is read from the profile it names, and held against the system of the "
        "same run that it is compared with: django-vtasks, or what PostgreSQL allows on this "
        "machine (the raw SQL row, the bare-SQL floor). Medians of the profile's repeats, "
        "min-max in brackets. Where a target is missed, the last column links to the section "
        f"of [Performance]({PERFORMANCE}) that says where the time goes.",
        "",
        "| Target | Profile | django-sqltasks | Same run | Ratio or gap | Met? | Where the time "
        "goes |",
        "|---|---|---|---|---|---|---|",
    ]
    for target in TARGETS:
        mine = _metric(by_profile, target, target.system)
        where = f"[{SECTIONS[target.explained]}]({PERFORMANCE}#{target.explained})"
        label = f"{target.text}" + (
            f" ({SYSTEMS[target.system].label})" if target.system != "sqltasks-pg" else ""
        )
        if mine is None:
            lines.append(f"| {label} | `{target.profile}` | not measured | | | | {where} |")
            continue
        theirs = _metric(by_profile, target, target.against) if target.against else None
        other = (
            f"{SYSTEMS[target.against].label}: {_figure(theirs, target.metric)}"
            if target.against and theirs is not None
            else "—"
        )
        compared, met = _verdict(
            target, mine["median"], theirs["median"] if theirs is not None else None
        )
        verdict = "—" if met is None else ("yes" if met else "**no**")
        lines.append(
            f"| {label} | `{target.profile}` | {_figure(mine, target.metric)} | {other} | "
            f"{compared} | {verdict} | {where if met is not True else ''} |"
        )
    return "\n".join(lines) + "\n"
