"""Charts drawn on the server as SVG: stacked bars per day, and horizontal bars.

Small on purpose (no chart library, nothing fetched by the page): axes with round ticks, a
legend, and a ``<title>`` on every bar so hovering shows its value. Every label is escaped
(model names and usernames are data, not markup).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

__all__ = ["COLOURS", "Series", "horizontal_bars", "nice_ticks", "stacked_bars"]

#: a palette told apart by most people with colour vision deficiencies (Okabe-Ito, then grey).
COLOURS = (
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
    "#999999",
)  # fmt: skip
WIDTH = 760
#: characters of a label drawn (the whole label is in the bar's title, and the tables).
LABEL = 30
FONT = 'font-family="system-ui, sans-serif" font-size="11"'

Number = int | float | Decimal
Format = Callable[[float], str]


@dataclass(frozen=True)
class Series:
    """One stack of a bar chart: a label and a value per day (the chart's days, in order)."""

    label: str
    values: Sequence[Number]


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top`` (about ``count`` of them)."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return [step * index for index in range(math.ceil(top / step - 1e-9) + 1)]


def _text(x: float, y: float, text: str, anchor: str = "start", extra: str = "") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" {FONT}{extra}>{escape(text)}</text>'
    )


def stacked_bars(
    days: Sequence[date],
    series: Sequence[Series],
    *,
    title: str,
    formatter: Format,
    height: int = 280,
) -> SafeString:
    """A bar per day, one stacked segment per series; a legend under it."""
    left, right, top, bottom = 78, 12, 26, 44
    legend_rows = math.ceil(len(series) / 3)
    total_height = height + legend_rows * 18 + 8
    plot_width, plot_height = WIDTH - left - right, height - top - bottom
    totals = [sum(float(s.values[i]) for s in series) for i in range(len(days))]
    ticks = nice_ticks(max(totals, default=0.0))
    scale = plot_height / ticks[-1]
    slot = plot_width / max(1, len(days))
    bar = max(1.0, slot * 0.8)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {total_height}" '
        f'width="100%" role="img" aria-label="{escape(title)}" class="agentloop-chart">',
        _text(left, 16, title, extra=' font-weight="bold" font-size="13"'),
    ]
    for tick in ticks:
        y = top + plot_height - tick * scale
        parts.append(
            f'<line x1="{left}" x2="{WIDTH - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
        )
        parts.append(_text(left - 6, y + 4, formatter(tick), "end"))
    every = max(1, math.ceil(len(days) / 12))  # at most a dozen day labels
    for index, day in enumerate(days):
        x = left + index * slot + (slot - bar) / 2
        y = top + plot_height
        for number, item in enumerate(series):
            value = float(item.values[index])
            if value <= 0:
                continue
            size = value * scale
            y -= size
            parts.append(
                f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" '
                f'height="{max(size, 0.5):.1f}" fill="{COLOURS[number % len(COLOURS)]}">'
                f"<title>{escape(f'{item.label} on {day:%Y-%m-%d}: {formatter(value)}')}</title>"
                "</rect>"
            )
        if index % every == 0:
            parts.append(_text(x + bar / 2, top + plot_height + 16, f"{day:%b %d}", "middle"))
    axis_y = top + plot_height
    parts.append(
        f'<line x1="{left}" x2="{WIDTH - right}" y1="{axis_y}" y2="{axis_y}" stroke="#666"/>'
    )
    for number, item in enumerate(series):
        x = left + (number % 3) * (plot_width / 3)
        y = height + (number // 3) * 18
        colour = COLOURS[number % len(COLOURS)]
        parts.append(
            f'<rect class="legend" x="{x:.1f}" y="{y - 9}" width="10" height="10" fill="{colour}"/>'
        )
        parts.append(_text(x + 14, y, _shorten(item.label, LABEL)))
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text above went through escape()


def horizontal_bars(
    items: Sequence[tuple[str, Number, str]], *, title: str, formatter: Format
) -> SafeString:
    """One bar per ``(label, value, detail)``, longest first as given; ``detail`` is shown
    after the value."""
    left, right, top, row = 200, 150, 26, 24
    height = top + row * len(items) + 10
    plot_width = WIDTH - left - right
    largest = max((float(value) for _, value, _ in items), default=0.0) or 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'width="100%" role="img" aria-label="{escape(title)}" class="agentloop-chart">',
        _text(8, 16, title, extra=' font-weight="bold" font-size="13"'),
    ]
    for index, (label, value, detail) in enumerate(items):
        y = top + index * row
        size = max(1.0, float(value) / largest * plot_width)
        parts.append(_text(left - 8, y + 15, _shorten(label, LABEL), "end"))
        parts.append(
            f'<rect class="bar" x="{left}" y="{y + 3}" width="{size:.1f}" height="{row - 6}" '
            f'fill="{COLOURS[0]}"><title>{escape(f"{label}: {formatter(float(value))}")}'
            "</title></rect>"
        )
        parts.append(_text(left + size + 6, y + 15, f"{formatter(float(value))}  {detail}"))
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text above went through escape()


def _shorten(text: str, length: int) -> str:
    return text if len(text) <= length else text[: length - 1] + "…"
