"""Server-drawn charts: the geometry of an SVG line chart, worked out here so the template only
places it. No JavaScript draws anything, so the charts read the same with it off."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, tzinfo

from queues.activity import SERIES, OccupancyHistory, QueueThroughput

# The plot stretches to its box (its lines keep their width); the labels are HTML around it,
# so they read the same at 390 px and at 1440 px.
WIDTH = 600
HEIGHT = 120
LEFT = 0
RIGHT = 0
TOP = 4
BOTTOM = 2
LABELS = {"claims": "claims", "completions": "completions", "failures": "failures"}


@dataclass(frozen=True)
class Line:
    kind: str
    label: str
    points: str  # the polyline's "x,y x,y …"
    total: int
    peak: int
    peak_at: datetime | None


@dataclass(frozen=True)
class Tick:
    x: float
    y: float
    text: str


@dataclass(frozen=True)
class Chart:
    queue: str
    width: int
    height: int
    lines: list[Line]
    y_ticks: list[Tick]  # gridlines: y is the line's height, text its value
    x_ticks: list[Tick]
    plot_left: int
    plot_right: int
    top: int  # what the top gridline stands for, per minute
    rows: list[tuple[str, dict[str, int]]]  # the minutes with any activity, for the table
    span: str = "last hour"

    @property
    def summary(self) -> str:
        """The chart in one sentence (its text alternative)."""
        parts = [f"{line.total} {line.label}" for line in self.lines]
        busiest = max(self.lines, key=lambda line: line.peak)
        text = f"{self.queue}, {self.span}: {', '.join(parts)}."
        if busiest.peak and busiest.peak_at is not None:
            text += (
                f" Busiest minute: {busiest.peak} {busiest.label} at {busiest.peak_at:%H:%M %Z}."
            )
        return text


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50 … at or above value (so gridlines read round)."""
    if value <= 1:
        return 1
    magnitude: int = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


def throughput_chart(data: QueueThroughput, zone: tzinfo) -> Chart:
    top = nice_ceiling(data.busiest)
    n = len(data.minutes)
    span_x = WIDTH - LEFT - RIGHT
    span_y = HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return round(LEFT + span_x * i / max(n - 1, 1), 1)

    def y(v: float) -> float:
        return round(TOP + span_y * (1 - v / top), 1)

    lines = []
    for kind in SERIES:
        counts = data.series[kind]
        peak, peak_at = data.peak(kind)
        lines.append(
            Line(
                kind=kind,
                label=LABELS[kind],
                points=" ".join(f"{x(i)},{y(c)}" for i, c in enumerate(counts)),
                total=data.total(kind),
                peak=peak,
                peak_at=peak_at.astimezone(zone) if peak_at else None,
            )
        )
    y_ticks = [Tick(LEFT, y(v), str(v)) for v in sorted({0, top // 2, top}) if v or top]
    x_ticks = [
        Tick(x(i), HEIGHT - 6, data.minutes[i].astimezone(zone).strftime("%H:%M"))
        for i in (0, n // 2, n - 1)
    ]
    rows = [
        (m.astimezone(zone).strftime("%H:%M"), {k: data.series[k][i] for k in SERIES})
        for i, m in enumerate(data.minutes)
        if any(data.series[k][i] for k in SERIES)
    ]
    return Chart(
        queue=data.queue,
        width=WIDTH,
        height=HEIGHT,
        lines=lines,
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        plot_left=LEFT,
        plot_right=WIDTH - RIGHT,
        top=top,
        rows=rows,
    )


def occupancy_chart(history: OccupancyHistory, zone: tzinfo) -> Chart:
    """A pool's or tag's most claims held at once per minute over 24 h, with its limit as it is
    now as a gridline (a change during the day is in the ledger, not drawn)."""
    top = nice_ceiling(max(history.peak, history.limit))
    n = len(history.minutes)
    span_x = WIDTH - LEFT - RIGHT
    span_y = HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return round(LEFT + span_x * i / max(n - 1, 1), 1)

    def y(v: float) -> float:
        return round(TOP + span_y * (1 - v / top), 1)

    peak_i = max(range(n), key=lambda i: history.held[i]) if n else 0
    line = Line(
        kind="held",
        label="held at once at the busiest minute",
        points=" ".join(f"{x(i)},{y(c)}" for i, c in enumerate(history.held)),
        total=history.peak,
        peak=history.peak,
        peak_at=history.minutes[peak_i].astimezone(zone) if history.peak else None,
    )
    y_ticks = [Tick(LEFT, y(v), str(v)) for v in sorted({0, history.limit, top})]
    x_ticks = [
        Tick(x(i), HEIGHT - 6, history.minutes[i].astimezone(zone).strftime("%H:%M"))
        for i in (0, n // 2, n - 1)
    ]
    rows = [
        (m.astimezone(zone).strftime("%d %b %H:%M"), {"held": history.held[i]})
        for i, m in enumerate(history.minutes)
        if history.held[i]
    ]
    return Chart(
        queue=f"{history.kind} {history.name}",
        width=WIDTH,
        height=HEIGHT,
        lines=[line],
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        plot_left=LEFT,
        plot_right=WIDTH - RIGHT,
        top=top,
        rows=rows,
        span=f"last 24 hours, limit now {history.limit} ({history.posture})",
    )
