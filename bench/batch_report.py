"""The batch drain's part of the suite's report (issue 55): ``bench.batch_drain``'s median
rounds (batch consumer, single-message consumer and Dramatiq, interleaved, in the same
run) as a table, and the targets judged from them."""

from __future__ import annotations

from typing import Any

#: a million messages a minute
BATCH_RATE_TARGET = 16_700
BATCH_VS_SINGLE_TARGET = 5.0
SINGLE_VS_DRAMATIQ_CPU_TARGET = 0.5
LABELS = {"sqlqueue_batch": "sqlqueue, `@batch_consumer(max_batch=500)`",
          "sqlqueue": "sqlqueue, `@consumer`", "dramatiq": "Dramatiq + Redis"}


def _figure(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def batch_markdown(section: dict[str, Any] | None) -> list[str]:
    """The section's lines, or none when the batch drain did not run."""
    if not section:
        return []
    found = section["summary"]
    lines = ["", f"### Batch drain ({section['messages']:,} messages, "
             f"{section['processes']} processes, median of {section['rounds']} "
             "interleaved round(s))", "",
             "| contender | msg/s | worker CPU ms a message | server CPU ms a message |",
             "|---|---:|---:|---:|"]
    for peer, label in LABELS.items():
        row = found.get(peer)
        if row:
            lines.append(f"| {label} | {_figure(row['messages_per_s'], 0)} | "
                         f"{_figure(row['worker_cpu_ms_per_message'])} | "
                         f"{_figure(row['server_cpu_ms_per_message'])} ({row['server']}) |")
    judged = [f"| {t} | {w} | {m} | {'yes' if ok else 'no'} |"
              for t, w, m, ok in batch_targets(section)]
    return [*lines, "", "| target | wanted | measured | met |", "|---|---|---|---|", *judged]


def batch_targets(section: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(target, wanted, measured, met) for those the run's figures can judge."""
    found = section["summary"]
    ratios = found.get("ratios", {})
    out: list[tuple[str, str, str, bool]] = []
    rate = (found.get("sqlqueue_batch") or {}).get("messages_per_s")
    if rate is not None:
        out.append(("batch drain, 2 processes", f">= {BATCH_RATE_TARGET:,} msg/s",
                    f"{rate:,.0f} msg/s", rate >= BATCH_RATE_TARGET))
    checks = (("batch vs single-message drain, same run", "batch_vs_single_rate",
               BATCH_VS_SINGLE_TARGET, True),
              ("single-message worker CPU a message vs Dramatiq's",
               "single_vs_dramatiq_worker_cpu", SINGLE_VS_DRAMATIQ_CPU_TARGET, False))
    for label, key, bound, at_least in checks:
        value = ratios.get(key)
        if value is not None:
            met = value >= bound if at_least else value <= bound
            out.append((label, f"{'>=' if at_least else '<='} {bound:g}x", f"{value:.2f}x",
                        met))
    return out
