"""Bar charts drawn on the server as inline SVG: axes, gridlines, labels, a tooltip per bar.

No JavaScript and no charting library: the dashboard's two charts are bars over time, which a
few dozen lines of SVG draw exactly, print, scale and read out to a screen reader (each bar has
a <title>), and refresh with the rest of the page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

WIDTH, HEIGHT = 760, 190
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 12, 28  # room for the axes' labels


def nice_ceiling(peak: float, ticks: int = 4) -> tuple[float, float]:
    """(axis top, tick step) for values up to ``peak``: steps of 1, 2 or 5 times a power of ten."""
    if peak <= 0:
        return 1.0, 1.0
    raw = peak / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    step = max(step, 1.0)  # counts: no fractional ticks
    return step * math.ceil(peak / step), step


def _n(number: float) -> str:
    """A coordinate, to a tenth of a pixel (format_html escapes its arguments to text first)."""
    return f"{number:.1f}"


def _label(number: float) -> str:
    if number >= 1_000_000:
        return f"{number / 1_000_000:g}M"
    if number >= 10_000:
        return f"{number / 1000:g}k"
    return f"{number:,.0f}"


def _time_label(moment: datetime, resolution: int) -> str:
    local = timezone.localtime(moment)
    return local.strftime("%H:%M")


def bar_chart(
    buckets: Sequence[tuple[datetime, Sequence[int]]],
    *,
    series: Sequence[tuple[str, str]],
    resolution: int,
    title: str,
    chart_id: str,
) -> str:
    """An SVG of stacked bars: ``buckets`` are (start, values per series), oldest first;
    ``series`` names each value and its CSS class. The y axis counts per bucket."""
    count = len(buckets)
    totals = [sum(values) for _start, values in buckets]
    top, step = nice_ceiling(max(totals, default=0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(count, 1)
    bar_w = max(slot * 0.8, 1.0)

    def y(value: float) -> float:
        return TOP + plot_h - plot_h * value / top

    grid = []
    tick = 0.0
    while tick <= top + 1e-9:
        grid.append(
            format_html(
                '<line class="bw-grid" x1="{}" x2="{}" y1="{y}" y2="{y}"/><text class="bw-axis" x="{}" y="{ty}" text-anchor="end">{}</text>',
                LEFT,
                WIDTH - RIGHT,
                LEFT - 6,
                _label(tick),
                y=_n(y(tick)),
                ty=_n(y(tick) + 4),
            )
        )
        tick += step
    bars = []
    per = "minute" if resolution == 60 else "hour"
    for index, (start, values) in enumerate(buckets):
        x = LEFT + index * slot + (slot - bar_w) / 2
        base = 0
        parts = ", ".join(f"{value:,} {name}" for (name, _css), value in zip(series, values, strict=True))
        tip = f"{timezone.localtime(start):%Y-%m-%d %H:%M}: {parts}"
        rects = []
        for (_name, css), value in zip(series, values, strict=True):
            if value:
                rects.append(
                    format_html(
                        '<rect class="{}" x="{}" y="{}" width="{}" height="{}"/>',
                        css,
                        _n(x),
                        _n(y(base + value)),
                        _n(bar_w),
                        _n(y(base) - y(base + value)),
                    )
                )
            base += value
        # A transparent full-height target, so that even an empty bucket has its tooltip.
        rects.append(
            format_html(
                '<rect class="bw-hit" x="{}" y="{}" width="{}" height="{}"/>', _n(LEFT + index * slot), TOP, _n(slot), plot_h
            )
        )
        bars.append(format_html('<g class="bw-bar"><title>{}</title>{}</g>', tip, mark_safe("".join(rects))))
    label_every = max(1, math.ceil(count / 8))
    x_labels = format_html_join(
        "",
        '<text class="bw-axis" x="{}" y="{}" text-anchor="middle">{}</text>',
        (
            (_n(LEFT + i * slot + slot / 2), HEIGHT - 8, _time_label(start, resolution))
            for i, (start, _v) in enumerate(buckets)
            if i % label_every == 0
        ),
    )
    summary = ", ".join(f"{sum(values[k] for _s, values in buckets):,} {name}" for k, (name, _css) in enumerate(series))
    return format_html(
        '<svg class="bw-chart" id="{id}" viewBox="0 0 {w} {h}" role="img" aria-labelledby="{id}-title" preserveAspectRatio="xMidYMid meet">'
        '<title id="{id}-title">{title}: {summary} (per {per})</title>'
        "{grid}"
        '<line class="bw-axis-line" x1="{left}" x2="{right}" y1="{base}" y2="{base}"/>'
        '<line class="bw-axis-line" x1="{left}" x2="{left}" y1="{top}" y2="{base}"/>'
        "{bars}{x_labels}</svg>",
        id=chart_id,
        w=WIDTH,
        h=HEIGHT,
        title=title,
        summary=summary,
        per=per,
        grid=mark_safe("".join(grid)),
        left=LEFT,
        right=WIDTH - RIGHT,
        base=TOP + plot_h,
        top=TOP,
        bars=mark_safe("".join(bars)),
        x_labels=x_labels,
    )
