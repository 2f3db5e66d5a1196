"""The live overview's charts: inline SVG drawn on the server (no JavaScript library, no
CDN), a fixed-size picture that scales as a whole (its axis text stays legible). Each
series has its own line pattern as well as its colour, named in a legend drawn with the
same pattern, so that the charts read without colour; the page's tables give the
numbers themselves."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from sqlqueue.operations.overview import Minute

WIDTH, HEIGHT = 500, 190
LEFT, RIGHT, TOP, BOTTOM = 70, 12, 12, 40  # margins: the axes' labels

#: The chart's text, axes and grid are drawn in ``currentColor``, the admin's body text
#: colour (``--body-fg``), so that they follow its light and dark themes; the grid lines
#: are the same colour, faint.
FRAME = "color:var(--body-fg, #333)"
GRID_OPACITY, AXIS_OPACITY = "0.18", "0.6"


@dataclass(frozen=True)
class Series:
    label: str
    value: Callable[[Minute], float | None]
    color: str  # light theme; the page's stylesheet gives a lighter one in the dark theme
    dash: str  # stroke-dasharray: the pattern that tells the series apart without colour
    marker: str = ""  # "circle" or "square" at each minute with a value (sparse series)

    @property
    def key(self) -> str:
        """The series' CSS custom property (``--sqlqueue-<key>``)."""
        return self.label.replace(" ", "-")

    @property
    def paint(self) -> str:
        return f"var(--sqlqueue-{self.key}, {self.color})"


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
#: the series' colours on the admin's dark background (#121212): lighter tones of the same
#: hues, each with a contrast of at least 4.5:1 there
DARK_COLORS = {"published": "#64b5f6", "acked": "#81c784", "retried": "#ffb74d",
               "dead-lettered": "#ef9a9a", "p50": "#64b5f6", "p95": "#ce93d8"}


def series_style() -> SafeString:
    """The stylesheet that gives each series its colour in the admin's light and dark
    themes (Django's ``dark_mode.css``: the system's preference unless the theme toggle
    chose light, or the toggle's dark)."""
    light = ";".join(f"--sqlqueue-{s.key}:{s.color}" for s in (*THROUGHPUT, *LATENCY))
    dark = ";".join(f"--sqlqueue-{key.replace(' ', '-')}:{color}"
                    for key, color in DARK_COLORS.items())
    return format_html(
        "<style>:root{{{}}}"
        '@media (prefers-color-scheme: dark){{:root:not([data-theme="light"]){{{}}}}}'
        'html[data-theme="dark"]{{{}}}</style>', light, dark, dark)


def throughput_chart(points: Sequence[Minute], label: str, step: int = 1) -> SafeString:
    """Messages per minute; over points of ``step`` minutes, their average per minute."""
    return _chart(points, THROUGHPUT, "messages per minute" if step == 1 else
                  f"per minute (avg of {step} min)", label, whole=step == 1, step=step)


def latency_chart(points: Sequence[Minute], label: str, step: int = 1) -> SafeString:
    return _chart(points, LATENCY, "handler duration (s)", label, whole=False, step=step)


def legend(series: Sequence[Series]) -> SafeString:
    """The series' names, each beside a sample of its line."""
    return format_html(
        '<ul class="sqlqueue-legend" style="list-style:none;display:flex;gap:1.2em;'
        'padding:0;margin:0 0 4px 0">{}</ul>',
        format_html_join("", '<li style="list-style:none;padding:0"><svg width="28" '
                             'height="10" aria-hidden="true"><line x1="0" y1="5" x2="28" '
                             'y2="5" style="stroke:{}" stroke-width="2.5" '
                             'stroke-dasharray="{}"/>{}</svg> {}</li>',
                         ((s.paint, s.dash, _marker(s, 14, 5), s.label) for s in series)))


def nice_ticks(top: float, whole: bool, count: int = 4) -> list[float]:
    """Round tick values from 0 to at least ``top``: a step of 1, 2 or 5 times a power of
    ten, about ``count`` steps (whole numbers only when ``whole``: message counts)."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))
    if whole:
        step = max(step, 1.0)
    steps = math.ceil(top / step - 1e-9)
    return [_round(i * step) for i in range(steps + 1)]


def tick_text(value: float) -> str:
    """A tick value as written: no float noise (0.30000000000000004), no needless zeros."""
    return f"{value:.6g}"


def _round(value: float) -> float:
    return float(f"{value:.12g}")


def _x_step(minutes: int) -> int:
    """Minutes between the x axis' ticks: four or so ticks whatever the range."""
    return max(1, next((s for s in (1, 5, 10, 15, 30, 60, 120, 360) if minutes / s <= 4),
                       minutes // 4))


def _ago(minutes: int, hours: bool) -> str:
    """An x tick: "now", or how long ago, in minutes (in hours on a range of hours)."""
    if minutes == 0:
        return "now"
    return f"-{minutes // 60}" if hours else f"-{minutes}"


def _chart(minutes: Sequence[Minute], series: Sequence[Series], y_title: str, label: str,
           whole: bool, step: int = 1) -> SafeString:
    """The last of ``minutes`` (points of ``step`` minutes each) holds the current minute,
    still filling: it is drawn apart, on a shaded band titled "this minute, so far", its
    segment faint, so that a minute half over does not read as a drop. Message counts of
    a point of several minutes are drawn as their average per minute."""
    values = [[_per_minute(s.value(m), step if s in THROUGHPUT else 1) for m in minutes]
              for s in series]
    ticks = nice_ticks(max([v for line in values for v in line if v is not None] + [0.0]),
                       whole)
    top = ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(index: int) -> float:
        return LEFT + plot_w * index / max(len(minutes) - 1, 1)

    def y(value: float) -> float:
        return TOP + plot_h * (1 - value / top)

    lines = format_html_join("", "{}", (
        (_polylines(line, s, x, y),) for s, line in zip(series, values, strict=True)))
    y_ticks = format_html_join("", (
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="currentColor" stroke-opacity="{}"/>'
        '<text x="{}" y="{}" text-anchor="end" font-size="11" fill="currentColor">{}</text>'),
        ((LEFT, _n(y(v)), WIDTH - RIGHT, _n(y(v)), GRID_OPACITY, LEFT - 4, _n(y(v) + 4),
          tick_text(v)) for v in ticks))
    last = len(minutes) - 1
    hours = step > 1  # a range of hours: the x axis in hours
    tick_every = max(1, _x_step((last + 1) * step) // step)
    x_ticks = format_html_join("", (
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="currentColor" stroke-opacity="{}"/>'
        '<text x="{}" y="{}" text-anchor="middle" font-size="11" fill="currentColor">{}'
        "</text>"),
        ((_n(x(i)), TOP + plot_h, _n(x(i)), TOP + plot_h + 4, AXIS_OPACITY, _n(x(i)),
          TOP + plot_h + 16, _ago((last - i) * step, hours))
         for i in range(last, -1, -tick_every)))
    partial = format_html(
        '<rect class="sqlqueue-partial-minute" x="{}" y="{}" width="{}" height="{}" '
        'fill="currentColor" fill-opacity="0.08"><title>{}</title></rect>',
        _n(x(last - 1)), TOP, _n(x(last) - x(last - 1)), plot_h,
        "this minute, so far" if step == 1 else
        f"the last {step} minutes, this minute so far") if last >= 1 else ""
    return format_html(
        '<svg class="sqlqueue-activity-chart" role="img" aria-label="{}" width="{}" '
        'height="{}" viewBox="0 0 {} {}" style="max-width:100%;height:auto;{}">'
        "<title>{}</title>{}{}{}"
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="currentColor" stroke-opacity="{}"/>'
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="currentColor" stroke-opacity="{}"/>{}'
        '<text x="{}" y="{}" text-anchor="middle" font-size="12" fill="currentColor">'
        "{} ago (database time)</text>"
        '<text transform="translate(14 {}) rotate(-90)" text-anchor="middle" '
        'font-size="12" fill="currentColor">{}</text></svg>',
        label, WIDTH, HEIGHT, WIDTH, HEIGHT, FRAME, label, partial, y_ticks, x_ticks,
        LEFT, TOP, LEFT, TOP + plot_h, AXIS_OPACITY,
        LEFT, TOP + plot_h, WIDTH - RIGHT, TOP + plot_h, AXIS_OPACITY,
        lines, LEFT + plot_w / 2, HEIGHT - 6, "hours" if hours else "minutes",
        _n(TOP + plot_h / 2), y_title)


def _per_minute(value: float | None, step: int) -> float | None:
    return value if value is None or step == 1 else value / step


def _polylines(line: Sequence[float | None], series: Series,
               x: Callable[[int], float], y: Callable[[float], float]) -> SafeString:
    """One polyline per run of complete minutes with a value (a percentile has none in a
    minute without runs: a gap, not a drop to zero); the current minute's segment apart,
    faint (class ``sqlqueue-partial``)."""
    runs: list[list[str]] = [[]]
    markers = []
    complete, current = line[:-1], line[-1] if line else None
    for index, value in enumerate(complete):
        if value is None:
            runs.append([])
        else:
            runs[-1].append(f"{_n(x(index))},{_n(y(value))}")
            markers.append(_marker(series, x(index), y(value)))
    lines = format_html_join("", (
        '<polyline points="{}" fill="none" style="stroke:{}" stroke-width="2" '
        'stroke-dasharray="{}"><title>{}</title></polyline>'),
        ((" ".join(run), series.paint, series.dash, series.label)
         for run in runs if len(run) > 1))
    partial = SafeString("")
    if current is not None:
        last = len(line) - 1
        markers.append(_marker(series, x(last), y(current), faint=True))
        if len(line) > 1 and line[-2] is not None:
            partial = format_html(
                '<line class="sqlqueue-partial" x1="{}" y1="{}" x2="{}" y2="{}" '
                'style="stroke:{}" stroke-width="2" stroke-opacity="0.45" '
                'stroke-dasharray="{}"><title>{}: this minute, so far</title></line>',
                _n(x(last - 1)), _n(y(line[-2])), _n(x(last)), _n(y(current)),
                series.paint, series.dash or "none", series.label)
    return format_html("{}{}{}", lines, partial,
                       format_html_join("", "{}", ((m,) for m in markers)))


def _marker(series: Series, cx: float, cy: float, faint: bool = False) -> SafeString:
    opacity = "0.45" if faint else "1"
    if series.marker == "circle":
        return format_html('<circle cx="{}" cy="{}" r="3" style="fill:{}" fill-opacity="{}"/>',
                           _n(cx), _n(cy), series.paint, opacity)
    if series.marker == "square":
        return format_html('<rect x="{}" y="{}" width="6" height="6" style="fill:{}" '
                           'fill-opacity="{}"/>', _n(cx - 3), _n(cy - 3), series.paint,
                           opacity)
    return SafeString("")


def _n(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")
