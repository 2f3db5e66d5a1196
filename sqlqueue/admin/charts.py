"""Small charts for the admin, rendered on the server as inline SVG (no JavaScript, no
CDN): a picture of which partitions lag reads faster than a table of a thousand rows."""

from __future__ import annotations

from collections.abc import Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from sqlqueue.operations.lag_shapes import PartitionLag

STATUS_COLORS = {"OK": "#2e7d32", "WARN": "#f9a825", "STALL": "#ef6c00", "STOP": "#c62828",
                 "PAUSED": "#546e7a"}


def status_strip(partitions: Sequence[PartitionLag], width: int = 240,
                 height: int = 14) -> SafeString:
    """One segment per partition, in key order, coloured by its status."""
    if not partitions:
        return format_html("<span>{}</span>", "no partitions")
    step = width / len(partitions)
    segments = format_html_join(
        "", '<rect x="{}" y="0" width="{}" height="{}" fill="{}">'
            "<title>{}: {}</title></rect>",
        ((_n(i * step), _n(step), height, STATUS_COLORS[p.status], p.partition_key, p.status)
         for i, p in enumerate(partitions)),
    )
    return format_html(
        # Scales with its cell (80 px to ``width``), so that the overview fits a laptop.
        '<svg class="sqlqueue-strip" role="img" width="{}" height="{}" '
        'viewBox="0 0 {} {}" preserveAspectRatio="none" '
        'style="display:block;width:100%;min-width:80px;max-width:{}px;height:{}px" '
        'aria-label="{}">{}</svg>',
        width, height, width, height, width, height, _summary(partitions), segments,
    )


def pending_columns(partitions: Sequence[PartitionLag], width: int = 800,
                    height: int = 120) -> SafeString:
    """One column per partition, in key order: its height is the pending count (relative
    to the largest), its colour the status."""
    if not partitions:
        return format_html("<span>{}</span>", "no partitions")
    pending = [p.pending or 0 for p in partitions]
    top = max(max(pending), 1)
    step = width / len(partitions)
    columns = format_html_join(
        "", '<rect x="{}" y="{}" width="{}" height="{}" fill="{}">'
            "<title>{}: {}{} pending, {}</title></rect>",
        ((_n(i * step), _n(height - _bar(count, top, height)), _n(max(step - 0.5, 0.5)),
          _n(_bar(count, top, height)), STATUS_COLORS[p.status], p.partition_key,
          ">=" if p.pending_capped else "", count, p.status)
         for i, (p, count) in enumerate(zip(partitions, pending, strict=True))),
    )
    return format_html(
        # Scales down with the page (never wider than ``width``).
        '<svg class="sqlqueue-columns" role="img" width="{}" height="{}" '
        'viewBox="0 0 {} {}" preserveAspectRatio="none" '
        'style="display:block;width:100%;max-width:{}px;height:{}px" aria-label="{}">'
        '<line x1="0" y1="{}" x2="{}" y2="{}" stroke="#999"/>{}</svg>',
        width, height, width, height, width, height, _summary(partitions), height, width,
        height, columns,
    )


def _n(value: float) -> str:
    """A coordinate, short: format_html escapes its arguments, so numbers come as text."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _bar(value: int, top: int, height: int) -> float:
    # Every lagging partition gets at least 2 px, so that a small lag is still seen.
    return 0.0 if value <= 0 else max(2.0, value / top * (height - 2))


def _summary(partitions: Sequence[PartitionLag]) -> str:
    counts: dict[str, int] = {}
    for p in partitions:
        counts[p.status] = counts.get(p.status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


#: partitions whose keys are written under their column; more get the first and last
LABELLED_PARTITIONS = 24


def pending_labels(partitions: Sequence[PartitionLag]) -> tuple[SafeString, SafeString]:
    """The axes of ``pending_columns``, in HTML beside the SVG (text inside a stretched
    SVG would be stretched too): the scale (the tallest column's count) above, and the
    partition keys under their columns, or the first and last key when there are many."""
    if not partitions:
        return SafeString(""), SafeString("")
    top = max(p.pending or 0 for p in partitions)
    capped = any(p.pending_capped for p in partitions)
    scale = format_html(
        '<div class="sqlqueue-axis-y">pending messages per partition (tallest: {}{})</div>',
        ">=" if capped else "", top)
    if len(partitions) <= LABELLED_PARTITIONS:
        keys = format_html_join(
            "", '<span title="{}" style="flex:1 1 0;min-width:0;overflow:hidden;'
                'text-overflow:ellipsis;white-space:nowrap;text-align:center">{}</span>',
            ((p.partition_key, p.partition_key) for p in partitions))
    else:
        keys = format_html(
            '<span>{}</span><span style="flex:1;text-align:center">{} partitions, in key '
            'order</span><span>{}</span>', partitions[0].partition_key, len(partitions),
            partitions[-1].partition_key)
    return scale, format_html(
        '<div class="sqlqueue-axis-x" style="display:flex;max-width:800px;gap:1px;'
        'font-size:11px;color:var(--body-quiet-color, #666)">{}</div>', keys)
