"""The live overview's charts: inline SVG drawn on the server (no JavaScript library, no
CDN), a fixed-size picture that scales as a whole (its axis text stays legible). Each
series has its own line pattern as well as its colour, named in a legend drawn with the
same pattern, so that the charts read without colour; the page's tables give the
numbers themselves."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from sqlqueue.operations.overview import Minute

WIDTH, HEIGHT = 500, 190
LEFT, RIGHT, TOP, BOTTOM = 70, 12, 12, 40  # margins: the axes' labels


@dataclass(frozen=True)
class Series:
    label: str
    value: Callable[[Minute], float | None]
    color: str
    dash: str  # stroke-dasharray: the pattern that tells the series apart without colour
    marker: str = ""  # "circle" or "square" at each minute with a value (sparse series)


THROUGHPUT = (
    Series("published", lambda m: m.published, "#1565c0", ""),
    Series("acked", lambda m: m.acked, "#2e7d32", "8 4"),
    Series("retried", lambda m: m.retried, "#ef6c00", "2 3"),
    Series("dead-lettered", lambda m: m.dead_lettered, "#c62828", "10 3 2 3"),
)
LATENCY = (
    Series("p50", lambda m: m.p50, "#1565c0", "", "circle"),
    Series("p95", lambda m: m.p95, "#6a1b9a", "8 4", "square"),
)


def throughput_chart(minutes: Sequence[Minute], label: str) -> SafeString:
    return _chart(minutes, THROUGHPUT, "messages per minute", label, _count_text)


def latency_chart(minutes: Sequence[Minute], label: str) -> SafeString:
    return _chart(minutes, LATENCY, "handler duration (s)", label, _seconds_text)


def legend(series: Sequence[Series]) -> SafeString:
    """The series' names, each beside a sample of its line."""
    return format_html(
        '<ul class="sqlqueue-legend" style="list-style:none;display:flex;gap:1.2em;'
        'padding:0;margin:0 0 4px 0">{}</ul>',
        format_html_join("", '<li style="list-style:none;padding:0"><svg width="28" '
                             'height="10" aria-hidden="true"><line x1="0" y1="5" x2="28" '
                             'y2="5" stroke="{}" stroke-width="2.5" stroke-dasharray="{}"/>'
                             "{}</svg> {}</li>",
                         ((s.color, s.dash, _marker(s, 14, 5), s.label) for s in series)))


def _chart(minutes: Sequence[Minute], series: Sequence[Series], y_title: str, label: str,
           text: Callable[[float], str]) -> SafeString:
    values = [[s.value(m) for m in minutes] for s in series]
    top = max([v for line in values for v in line if v is not None] + [0.0]) or 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(index: int) -> float:
        return LEFT + plot_w * index / max(len(minutes) - 1, 1)

    def y(value: float) -> float:
        return TOP + plot_h * (1 - value / top)

    lines = format_html_join("", "{}", (
        (_polylines(line, s, x, y),) for s, line in zip(series, values, strict=True)))
    y_ticks = format_html_join("", (
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#ccc"/>'
        '<text x="{}" y="{}" text-anchor="end" font-size="11">{}</text>'),
        ((LEFT, _n(y(v)), WIDTH - RIGHT, _n(y(v)), LEFT - 4, _n(y(v) + 4), text(v))
         for v in (0.0, top / 2, top)))
    last = len(minutes) - 1
    x_ticks = format_html_join("", (
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#999"/>'
        '<text x="{}" y="{}" text-anchor="middle" font-size="11">{}</text>'),
        ((_n(x(i)), TOP + plot_h, _n(x(i)), TOP + plot_h + 4, _n(x(i)), TOP + plot_h + 16,
          "now" if i == last else f"-{last - i}")
         for i in range(last, -1, -15)))
    return format_html(
        '<svg class="sqlqueue-activity-chart" role="img" aria-label="{}" width="{}" '
        'height="{}" viewBox="0 0 {} {}" style="max-width:100%;height:auto">'
        "<title>{}</title>{}{}"
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#666"/>'
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#666"/>{}'
        '<text x="{}" y="{}" text-anchor="middle" font-size="12">minutes ago (database '
        "time)</text>"
        '<text transform="translate(14 {}) rotate(-90)" text-anchor="middle" '
        'font-size="12">{}</text></svg>',
        label, WIDTH, HEIGHT, WIDTH, HEIGHT, label, y_ticks, x_ticks,
        LEFT, TOP, LEFT, TOP + plot_h, LEFT, TOP + plot_h, WIDTH - RIGHT, TOP + plot_h,
        lines, LEFT + plot_w / 2, HEIGHT - 6, _n(TOP + plot_h / 2), y_title)


def _polylines(line: Sequence[float | None], series: Series,
               x: Callable[[int], float], y: Callable[[float], float]) -> SafeString:
    """One polyline per run of minutes with a value (a percentile has none in a minute
    without runs: a gap, not a drop to zero)."""
    runs: list[list[str]] = [[]]
    markers = []
    for index, value in enumerate(line):
        if value is None:
            runs.append([])
        else:
            runs[-1].append(f"{_n(x(index))},{_n(y(value))}")
            markers.append(_marker(series, x(index), y(value)))
    lines = format_html_join("", (
        '<polyline points="{}" fill="none" stroke="{}" stroke-width="2" '
        'stroke-dasharray="{}"><title>{}</title></polyline>'),
        ((" ".join(run), series.color, series.dash, series.label)
         for run in runs if len(run) > 1))
    return format_html("{}{}", lines, format_html_join("", "{}", ((m,) for m in markers)))


def _marker(series: Series, cx: float, cy: float) -> SafeString:
    if series.marker == "circle":
        return format_html('<circle cx="{}" cy="{}" r="3" fill="{}"/>', _n(cx), _n(cy),
                           series.color)
    if series.marker == "square":
        return format_html('<rect x="{}" y="{}" width="6" height="6" fill="{}"/>',
                           _n(cx - 3), _n(cy - 3), series.color)
    return SafeString("")


def _count_text(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _seconds_text(value: float) -> str:
    return f"{value:.3g}"


def _n(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")
