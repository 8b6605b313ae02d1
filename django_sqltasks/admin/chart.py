"""A small inline SVG bar chart of throughput: no script, no network."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

CHART_WIDTH = 600  # pixels
CHART_HEIGHT = 120  # pixels
LABEL_EVERY = 5  # minutes between axis labels


@dataclass
class Bar:
    x: float
    width: float
    ok_y: float
    ok_height: float
    failed_y: float
    failed_height: float
    label: str  # shown under every LABEL_EVERY-th bar, else ""
    title: str  # the tooltip


@dataclass
class Chart:
    width: int
    height: int
    peak: int
    bars: list[Bar]


def throughput_chart(series: list[tuple[datetime, int, int]]) -> Chart:
    """Lay out one stacked bar per minute: successful below, failed on top."""
    peak = max((ok + failed for _, ok, failed in series), default=0)
    scale = CHART_HEIGHT / peak if peak else 0.0
    step = CHART_WIDTH / max(len(series), 1)
    bars = []
    for i, (minute, ok, failed) in enumerate(series):
        ok_height = ok * scale
        failed_height = failed * scale
        bars.append(
            Bar(
                x=round(i * step + 1, 1),
                width=round(max(step - 2, 1), 1),
                ok_y=round(CHART_HEIGHT - ok_height, 1),
                ok_height=round(ok_height, 1),
                failed_y=round(CHART_HEIGHT - ok_height - failed_height, 1),
                failed_height=round(failed_height, 1),
                label=minute.strftime("%H:%M") if i % LABEL_EVERY == 0 else "",
                title=f"{minute:%H:%M} UTC: {ok} succeeded, {failed} failed",
            )
        )
    return Chart(width=CHART_WIDTH, height=CHART_HEIGHT, peak=peak, bars=bars)
