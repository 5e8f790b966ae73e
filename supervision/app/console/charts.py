"""Charts as data for inline SVG: the geometry is computed here, the markup is written by
``templates/charts.html`` (Jinja2's autoescape covers every name and number), so a chart
needs no script and the CSP stays as it is.

>>> c = bar_chart("verdicts", "Verdicts per minute", "rows", starts, [("reconciled", [0, 3])])
>>> c.columns[1].label             # "12:04 UTC: reconciled 3": each slot's numbers as text

A chart is drawn in a fixed ``viewBox`` (:data:`WIDTH` x :data:`HEIGHT`) that CSS scales to
the page's width (1400 px or a phone's). Every series is a class ``s<i>`` (bars) or
``l<i>`` (lines), colours in console.css, never a value from the database; every slot has
a ``<title>`` with its numbers, and the chart a table of them beside it.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence

import attrs
from markupsafe import Markup, escape

WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 52, 8, 10, 24  # the plot area's margins
PALETTE = 10  # series classes s0..s9 / l0..l9


@attrs.frozen
class Bar:
    x: float
    y: float
    w: float
    h: float
    series: int


@attrs.frozen
class Column:
    """One slot: its hover target, its title (the slot's numbers) and its bars."""

    x: float
    w: float
    label: str
    bars: tuple[Bar, ...] = ()


@attrs.frozen
class Line:
    series: int
    name: str
    segments: tuple[str, ...]  # SVG points lists; a slot with no value breaks the line
    dots: tuple[tuple[float, float], ...] = ()  # every point (a lone one shows too)


@attrs.frozen
class Tick:
    at: float
    label: str


@attrs.frozen
class Legend:
    series: int
    name: str
    figure: str  # the series' total (bars) or its latest value (lines)


@attrs.frozen
class Chart:
    id: str
    title: str
    unit: str
    summary: str  # one sentence: the chart's numbers, for aria-label and the caption
    columns: tuple[Column, ...]
    lines: tuple[Line, ...]
    y_ticks: tuple[Tick, ...]
    x_ticks: tuple[Tick, ...]
    legend: tuple[Legend, ...]
    head: tuple[str, ...]  # the numbers table: time, then one column per series
    rows: tuple[tuple[str, ...], ...]  # the slots with a value, oldest first
    empty: bool
    width: int = WIDTH
    height: int = HEIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM
    left: int = LEFT
    right: int = WIDTH - RIGHT

    def plot(self) -> Markup:
        """The slots (a hover target with its numbers as ``<title>``, and their bars), the
        lines and their points, as SVG: built here in one pass (a 24-hour chart has 144
        slots), every text through :func:`markupsafe.escape`, every number formatted."""
        out = []
        height = self.bottom - self.top
        for col in self.columns:
            out.append(f'<g class="slot"><title>{escape(col.label)}</title><rect class="hit" '
                       f'x="{col.x:.1f}" y="{self.top}" width="{col.w:.1f}" '
                       f'height="{height}"/>')
            out.extend(f'<rect class="s{b.series:d}" x="{b.x:.1f}" y="{b.y:.1f}" '
                       f'width="{b.w:.1f}" height="{b.h:.1f}"/>' for b in col.bars)
            out.append("</g>\n")
        for line in self.lines:
            out.extend(f'<polyline class="l{line.series:d}" points="{escape(seg)}"><title>'
                       f'{escape(line.name)}</title></polyline>\n' for seg in line.segments)
            out.extend(f'<circle class="s{line.series:d}" cx="{x:.1f}" cy="{y:.1f}" r="3"/>'
                       for x, y in line.dots)
        return Markup("".join(out))

    def table(self) -> Markup:
        """The numbers table's rows (the slots with a value), escaped."""
        return Markup("".join(
            "<tr>" + "".join(f"<td>{escape(v)}</td>" for v in row) + "</tr>\n"
            for row in self.rows))


Values = Sequence[float | None]


def nice_max(value: float) -> float:
    """The smallest 1, 2 or 5 x 10^k at least *value* (1 for nothing)."""
    if not value or value <= 0 or math.isnan(value):
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power * (1 + 1e-9):
            return float(step * power)
    return 10 * power  # unreachable: 10 x power is always enough


def number(value: float | None) -> str:
    """A figure as text: whole numbers with thousands separators, else one decimal."""
    if value is None:
        return "—"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.1f}"


def _clock(at: dt.datetime) -> str:
    at = at.astimezone(dt.UTC)
    return f"{at.hour:02d}:{at.minute:02d}"


def _y(value: float, top: float) -> float:
    bottom = HEIGHT - BOTTOM
    return bottom - (bottom - TOP) * value / top


def _x_ticks(starts: Sequence[dt.datetime], slot_w: float) -> tuple[Tick, ...]:
    """About five labelled times, on round slots."""
    n = len(starts)
    every = max(1, n // 4)
    return tuple(Tick(LEFT + slot_w * i, _clock(starts[i]))
                 for i in range(0, n, every))


def _y_ticks(top: float) -> tuple[Tick, ...]:
    return tuple(Tick(_y(top * f, top), number(top * f)) for f in (0.0, 0.5, 1.0))


def _slot_label(clock: str, names: Sequence[str], values: Sequence[float | None],
                unit: str) -> str:
    shown = [f"{name} {number(v)}" for name, v in zip(names, values, strict=True)
             if v is not None]
    return f"{clock} UTC: " + (", ".join(shown) + f" {unit}" if shown else "no data")


def _frame(starts: Sequence[dt.datetime], series: Sequence[tuple[str, Values]]
           ) -> tuple[float, list[str], list[str], list[tuple[str, ...]]]:
    """The slot width, the series' names, each slot's clock and the table rows (the slots
    with a value)."""
    slot_w = (WIDTH - LEFT - RIGHT) / max(1, len(starts))
    names = [name for name, _ in series]
    clocks = [_clock(at) for at in starts]
    rows = []
    for i, clock in enumerate(clocks):
        values = [values[i] for _, values in series]
        if any(v for v in values):
            rows.append((f"{clock} UTC", *(number(v) for v in values)))
    return slot_w, names, clocks, rows


def bar_chart(id: str, title: str, unit: str, starts: Sequence[dt.datetime],
              series: Sequence[tuple[str, Values]]) -> Chart:
    """Stacked bars, one column per slot, the series stacked in their order."""
    slot_w, names, clocks, rows = _frame(starts, series)
    totals = [sum(v or 0 for v in values) for _, values in series]
    peak = max((sum(values[i] or 0 for _, values in series) for i in range(len(starts))),
               default=0)
    top = nice_max(peak)
    columns = []
    for i, clock in enumerate(clocks):
        base, bars = 0.0, []
        for s, (_, values) in enumerate(series):
            v = values[i] or 0
            if v > 0:
                y0, y1 = _y(base, top), _y(base + v, top)
                bars.append(Bar(LEFT + slot_w * i + slot_w * 0.1, y1,
                                slot_w * 0.8, y0 - y1, s % PALETTE))
                base += v
        columns.append(Column(LEFT + slot_w * i, slot_w, _slot_label(
            clock, names, [values[i] or 0 for _, values in series], unit), tuple(bars)))
    legend = tuple(Legend(s % PALETTE, name, number(total))
                   for s, (name, total) in enumerate(zip(names, totals, strict=True)))
    shown = ", ".join(f"{name} {number(total)}" for name, total in zip(
        names, totals, strict=True) if total)
    summary = f"{shown} {unit} in all" if shown else "none in this window"
    return Chart(id, title, unit, summary, tuple(columns), (), _y_ticks(top),
                 _x_ticks(starts, slot_w), legend, ("time (UTC)", *names), tuple(rows),
                 empty=not any(totals))


def line_chart(id: str, title: str, unit: str, starts: Sequence[dt.datetime],
               series: Sequence[tuple[str, Values]]) -> Chart:
    """One line per series through the middle of each slot; a slot without a value
    breaks its line."""
    slot_w, names, clocks, rows = _frame(starts, series)
    peak = max((v for _, values in series for v in values if v is not None), default=0)
    top = nice_max(peak)
    lines = []
    for s, (name, values) in enumerate(series):
        segments: list[str] = []
        points: list[str] = []
        dots: list[tuple[float, float]] = []
        for i, v in enumerate(values):
            if v is None:
                if points:
                    segments.append(" ".join(points))
                points = []
                continue
            dots.append((LEFT + slot_w * (i + 0.5), _y(v, top)))
            points.append(f"{dots[-1][0]:.1f},{dots[-1][1]:.1f}")
        if points:
            segments.append(" ".join(points))
        lines.append(Line(s % PALETTE, name, tuple(segments), tuple(dots)))
    columns = tuple(Column(LEFT + slot_w * i, slot_w, _slot_label(
        clock, names, [values[i] for _, values in series], unit))
        for i, clock in enumerate(clocks))
    latest = [next((v for v in reversed(values) if v is not None), None)
              for _, values in series]
    legend = tuple(Legend(s % PALETTE, name, "latest " + number(v))
                   for s, (name, v) in enumerate(zip(names, latest, strict=True)))
    summary = ", ".join(f"{name}: latest {number(v)}, peak {number(_peak(values))}"
                        for (name, values), v in zip(series, latest, strict=True))
    summary += f" ({unit})"
    return Chart(id, title, unit, summary, columns, tuple(lines), _y_ticks(top),
                 _x_ticks(starts, slot_w), legend, ("time (UTC)", *names), tuple(rows),
                 empty=all(v is None for _, values in series for v in values))


def _peak(values: Values) -> float | None:
    return max((v for v in values if v is not None), default=None)
