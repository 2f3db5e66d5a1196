"""The analytics report: plots (PNG, matplotlib) and one self-contained HTML page.

The page embeds its plots, so it can be mailed or attached to a ticket; the PNGs are also
written next to it. Every value shown is escaped.
"""

from __future__ import annotations

import base64
import html
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from sqlqueue.integrations.spark.analytics import Report

COLORS = ["#2b6cb0", "#dd6b20", "#38a169", "#c53030", "#805ad5", "#d69e2e", "#319795",
          "#b83280"]
MAX_SERIES = 8  # lines or bars per plot; the rest are summed into "other"
TABLE_ROWS = 15  # rows of each aggregate shown; the files have them all


MAX_BARS = 60  # time buckets drawn as bars; more are drawn as an area
TICK_FORMATS = {"second": "%H:%M:%S", "minute": "%H:%M", "hour": "%m-%d %H:00", "day": "%Y-%m-%d"}


def write_report(report: Report, out: Path) -> Path:
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    bucket = report.bucket
    per_bucket = f"messages_per_{bucket}"
    figures = {
        per_bucket: _messages_plot(report.frames[per_bucket], bucket),
        "latency": _latency_plot(report.frames["latency"]),
        "attempts": _attempts_plot(report.frames["attempts"]),
        "dead_letters": _dead_letter_plot(report.frames["dead_letters"]),
        "lag": _lag_plot(report.frames["lag"], bucket),
    }
    images = {}
    for name, figure in figures.items():
        if figure is None:
            continue
        path = plots / f"{name}.png"
        figure.savefig(path, dpi=110, bbox_inches="tight")
        _close(figure)
        images[name] = path
    page = out / "report.html"
    page.write_text(_html(report, images), encoding="utf-8")
    return page


# -- plots -------------------------------------------------------------------------------------

def _figure(title: str, height: float = 3.2) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, height))
    axes.set_title(title, loc="left", fontsize=11, fontweight="bold")
    axes.grid(axis="y", alpha=0.3)
    axes.spines[["top", "right"]].set_visible(False)
    return figure, axes


def _close(figure: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(figure)


def _top(frame: pd.DataFrame, key: str, value: str) -> list[str]:
    """The ``MAX_SERIES`` biggest series of ``frame`` by total ``value``."""
    totals = frame.groupby(key)[value].sum().sort_values(ascending=False)
    return [str(name) for name in totals.index[:MAX_SERIES]]


def _time_axis(axes: Any, moments: list[Any], bucket: str) -> None:
    """Label at most a dozen of the buckets (categorical positions 0..n-1)."""
    step = max(1, -(-len(moments) // 12))
    positions = list(range(0, len(moments), step))
    axes.set_xticks(positions, [moments[p].strftime(TICK_FORMATS[bucket]) for p in positions],
                    fontsize=8, rotation=30 if bucket != "second" else 0)
    axes.set_xlabel(f"{bucket} (UTC)", fontsize=8)


def _messages_plot(frame: pd.DataFrame, bucket: str) -> Any:
    if frame.empty:
        return None
    import pandas as pd

    from sqlqueue.integrations.spark.analytics_aggregates import BUCKETS

    table = frame.pivot_table(index=bucket, columns="topic", values="messages",
                              aggfunc="sum", fill_value=0).sort_index()
    moments = list(pd.date_range(table.index.min(), table.index.max(), freq=BUCKETS[bucket]))
    table = table.reindex(moments, fill_value=0)
    figure, axes = _figure(f"Messages per {bucket}, by topic")
    topics = [str(t) for t in table.sum().sort_values(ascending=False).index]
    positions = list(range(len(moments)))
    bottom = [0] * len(moments)
    for n, topic in enumerate(topics[:MAX_SERIES]):
        values = [int(v) for v in table[topic]]
        if len(moments) <= MAX_BARS:
            axes.bar(positions, values, bottom=bottom, label=topic, width=0.8,
                     color=COLORS[n % len(COLORS)])
        else:
            axes.fill_between(positions, bottom, [a + b for a, b in zip(bottom, values,
                                                                         strict=True)],
                              label=topic, color=COLORS[n % len(COLORS)], step="mid")
        bottom = [a + b for a, b in zip(bottom, values, strict=True)]
    axes.set_ylabel("messages")
    _time_axis(axes, moments, bucket)
    axes.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1, 1))
    return figure


def _labels(frame: pd.DataFrame) -> list[str]:
    return [f"{g} / {t}" for g, t in zip(frame["consumer_group"], frame["topic"], strict=True)]


def _latency_plot(frame: pd.DataFrame) -> Any:
    if frame.empty:
        return None
    shown = frame.head(MAX_SERIES * 2)
    spread = shown["p99_ms"].max() / max(1, shown["p50_ms"].clip(lower=1).min())
    scale = " (log scale)" if spread > 100 else ""
    figure, axes = _figure(f"Publish-to-ack latency by group and topic, ms{scale}",
                           height=1.2 + 0.45 * len(shown))
    positions = range(len(shown))
    for n, column in enumerate(("p50_ms", "p90_ms", "p99_ms")):
        axes.barh([p + (n - 1) * 0.27 for p in positions], shown[column].clip(lower=1),
                  height=0.25, label=column.replace("_ms", ""), color=COLORS[n])
    axes.set_yticks(list(positions), _labels(shown), fontsize=8)
    axes.invert_yaxis()
    if scale:
        axes.set_xscale("log")
    axes.grid(axis="x", alpha=0.3)
    axes.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1, 1))
    return figure


def _attempts_plot(frame: pd.DataFrame) -> Any:
    if frame.empty:
        return None
    pivot = frame.pivot_table(index=["consumer_group", "topic"], columns="attempts",
                              values="messages", aggfunc="sum", fill_value=0)
    pivot = pivot.head(MAX_SERIES * 2)
    figure, axes = _figure("Attempts per finished message", height=1.2 + 0.45 * len(pivot))
    labels = [f"{g} / {t}" for g, t in pivot.index]
    left = [0] * len(pivot)
    for n, attempts in enumerate(pivot.columns):
        values = pivot[attempts].tolist()
        axes.barh(labels, values, left=left, color=COLORS[n % len(COLORS)],
                  label=f"{attempts} attempt{'s' if attempts != 1 else ''}")
        left = [a + b for a, b in zip(left, values, strict=True)]
    axes.invert_yaxis()
    axes.tick_params(axis="y", labelsize=8)
    axes.grid(axis="x", alpha=0.3)
    axes.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1, 1))
    return figure


def _dead_letter_plot(frame: pd.DataFrame) -> Any:
    if frame.empty:
        return None
    shown = frame.head(MAX_SERIES * 2)
    figure, axes = _figure("Dead-letter rate by group and topic (% of the topic's messages)",
                           height=1.2 + 0.45 * len(shown))
    rates = (shown["rate"].fillna(0) * 100).tolist()
    axes.barh(_labels(shown), rates, color=COLORS[3])
    for n, (rate, count) in enumerate(zip(rates, shown["dead_letters"], strict=True)):
        axes.text(rate, n, f"  {rate:.2f}% ({count})", va="center", fontsize=8)
    axes.set_xlim(0, max(rates) * 1.3 or 1)  # room for the labels
    axes.invert_yaxis()
    axes.tick_params(axis="y", labelsize=8)
    axes.grid(axis="x", alpha=0.3)
    return figure


def _lag_plot(frame: pd.DataFrame, bucket: str) -> Any:
    if frame.empty:
        return None
    figure, axes = _figure(f"Lag at the end of each {bucket}: messages not yet finished")
    keyed = frame.assign(series=_labels(frame))
    moments = sorted(keyed[bucket].unique())
    index = {moment: n for n, moment in enumerate(moments)}
    for n, series in enumerate(_top(keyed, "series", "lag")):
        points = keyed[keyed["series"] == series]
        axes.step([index[m] for m in points[bucket]], points["lag"], where="post",
                  label=series, color=COLORS[n % len(COLORS)],
                  marker="o" if len(moments) < 30 else None, markersize=3)
    axes.set_ylabel("messages")
    axes.set_ylim(bottom=0)
    _time_axis(axes, [m.to_pydatetime() for m in moments], bucket)
    axes.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1, 1))
    return figure


# -- HTML --------------------------------------------------------------------------------------

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #1a202c; margin: 2rem auto;
       max-width: 1100px; padding: 0 1rem; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.meta { color: #4a5568; } .note { background: #fefcbf; padding: .5rem .8rem; }
.cards { display: flex; gap: 1rem; flex-wrap: wrap; margin: 1rem 0; }
.card { border: 1px solid #e2e8f0; border-radius: 6px; padding: .6rem 1rem; min-width: 9rem; }
.card b { display: block; font-size: 1.4rem; }
table { border-collapse: collapse; font-size: 12.5px; margin: .5rem 0; }
th, td { border-bottom: 1px solid #e2e8f0; padding: .25rem .6rem; text-align: right; }
th { background: #f7fafc; } td.text, th.text { text-align: left; }
img { max-width: 100%; } summary { color: #4a5568; cursor: pointer; margin: .3rem 0; }
"""


def _table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "<p class='meta'>No data in this window.</p>"
    shown = frame.head(TABLE_ROWS)

    def cell(value: Any, column: str) -> str:
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if isinstance(value, float):
            value = f"{value:,.3f}".rstrip("0").rstrip(".") if value == value else ""
        elif hasattr(value, "strftime"):
            value = value.strftime("%Y-%m-%d %H:%M:%S")
        kind = "" if numeric else " class='text'"
        return f"<td{kind}>{html.escape(str(value))}</td>"

    head = "".join(f"<th class='text'>{html.escape(str(c))}</th>" for c in shown.columns)
    body = "".join("<tr>" + "".join(cell(v, c) for c, v in row.items()) + "</tr>"
                   for _, row in shown.iterrows())
    more = (f"<p class='meta'>{len(frame) - TABLE_ROWS} more row(s) in the CSV.</p>"
            if len(frame) > TABLE_ROWS else "")
    return f"<table><tr>{head}</tr>{body}</table>{more}"


def _details(frame: pd.DataFrame, opened: bool) -> str:
    """The table under a plot, folded (the plot says it already); open without one."""
    summary = f"the numbers ({len(frame)} row{'s' if len(frame) != 1 else ''})"
    return (f"<details{' open' if opened else ''}><summary>{summary}</summary>"
            f"{_table(frame)}</details>")


def _image(images: dict[str, Path], name: str) -> str:
    path = images.get(name)
    if path is None:
        return ""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f"<img alt='{html.escape(name)}' src='data:image/png;base64,{data}'>"


def _cards(report: Report) -> str:
    frames = report.frames
    dead = int(frames["dead_letters"]["dead_letters"].sum()) if not frames[
        "dead_letters"].empty else 0
    per_bucket = frames[f"messages_per_{report.bucket}"]
    values = [
        ("messages", int(per_bucket["messages"].sum())),
        ("topics", per_bucket["topic"].nunique()),
        ("groups with history", len(frames["latency"])),
        ("dead letters", dead),
    ]
    return "<div class='cards'>" + "".join(
        f"<div class='card'><b>{value:,}</b>{html.escape(label)}</div>"
        for label, value in values) + "</div>"


def _html(report: Report, images: dict[str, Path]) -> str:
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    notes = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in report.notes)
    sections = [
        (f"Messages per topic, partition and {report.bucket}", f"messages_per_{report.bucket}"),
        ("Publish-to-ack latency and attempts per consumer group", "latency"),
        ("Attempts", "attempts"),
        ("Dead letters", "dead_letters"),
        ("Top errors of dead letters", "top_errors"),
        ("Lag over the window", "lag"),
    ]
    body = "".join(
        f"<h2>{html.escape(title)}</h2>{_image(images, name)}"
        + _details(report.frames[name], opened=name not in images)
        for title, name in sections)
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>sqlqueue report</title><style>{STYLE}</style></head><body>"
        "<h1>sqlqueue: what the queue did</h1>"
        f"<p class='meta'>{html.escape(report.window.describe())} &middot; source: "
        f"{html.escape(report.source)} &middot; generated {generated} &middot; the "
        "aggregates are in aggregates/ as Parquet and CSV</p>"
        f"{notes}{_cards(report)}{body}</body></html>"
    )
