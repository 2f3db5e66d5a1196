"""``queue status`` (lag and status of every group and topic) and ``queue health`` (exit
status 0 or 1 for probes)."""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import OutputWrapper

from sqlqueue.conf import get_settings
from sqlqueue.naming import escape_controls
from sqlqueue.operations.health import HealthReport, queue_health, runner_alive
from sqlqueue.operations.lag import known_subscriptions, subscription_lags
from sqlqueue.operations.lag_shapes import GroupLag
from sqlqueue.operations.unconsumed import UnconsumedTopic, unconsumed_topics


def show_status(out: OutputWrapper, options: dict[str, Any]) -> None:
    """One line per subscription (and per partition with ``--partitions``)."""
    # Every database the queue lives in (SQLQUEUE["DATABASE"] and ROUTES' aliases).
    databases = get_settings().databases
    subscriptions = [(alias, g, t) for alias in databases
                     for g, t in known_subscriptions(alias)
                     if options["group"] in (None, g) and options["topic"] in (None, t)]
    unconsumed = [(alias, row) for alias in databases for row in unconsumed_topics(alias)
                  if options["group"] is None and options["topic"] in (None, row.topic)]
    if not subscriptions:
        out.write("No consumer group has registered yet.")
        show_unconsumed(out, unconsumed)
        return
    where = len(databases) > 1
    out.write(f"{'status':6}  {'group':20}  {'topic':28}  {'pending':>9}  "
              f"{'dead':>6}  partitions" + ("  database" if where else ""))
    # Each database's subscriptions in one read (issue 52: a read per subscription took
    # 15 s and more with 1,500 subscribed topics).
    lags = {(alias, lag.group, lag.topic): lag for alias in databases
            for lag in subscription_lags([(g, t) for a, g, t in subscriptions if a == alias],
                                         using=alias)}
    for alias, group, topic in subscriptions:
        lag = lags[alias, group, topic]
        out.write(f"{lag.status:6}  {group:20}  {topic:28}  "
                  f"{_count(lag.pending, lag):>9}  {lag.dead_letters:>6}  "
                  f"{len(lag.partitions):>10}" + (f"  {alias}" if where else ""))
        if options["partitions"]:
            for p in lag.partitions:
                age = "-" if p.oldest_pending_age is None else f"{p.oldest_pending_age:.0f}s"
                out.write(
                    f"    {p.status:6} {p.partition_key:24} head {p.head_offset} "
                    f"watermark {p.watermark} pending {p.pending} in flight "
                    f"{p.in_flight} retrying {p.retrying} oldest {age} "
                    f"held by {escape_controls(p.leased_by) or '(nobody)'}"
                )
    show_unconsumed(out, unconsumed)


def show_unconsumed(out: OutputWrapper, unconsumed: list[tuple[str, UnconsumedTopic]]) -> None:
    """Topics with messages and no consumer group, after the subscriptions."""
    if not unconsumed:
        return
    out.write("Topics with messages and no consumer group (kept until a group consumes "
              "them):")
    for alias, row in unconsumed:
        count = f"{'>=' if row.capped else ''}{row.messages}"
        out.write(escape_controls(f"{'WARN':6}  {'-':20}  {row.topic:28}  {count:>9}")
                  + (f"  {alias}" if len(get_settings().databases) > 1 else ""))


def check_health(out: OutputWrapper, options: dict[str, Any]) -> None:
    """The verdict and its reasons; exits with status 1 when unhealthy."""
    report: HealthReport
    if options["liveness_file"]:
        report = runner_alive(options["liveness_file"], options["max_age"])
    else:
        report = queue_health(group=options["group"], topic=options["topic"])
    if options["json"]:
        out.write(json.dumps(report.as_dict(), sort_keys=True))
    else:
        out.write("healthy" if report.healthy else "unhealthy")
        for reason in report.reasons:
            out.write(escape_controls(f"  {reason}"))
        for warning in report.warnings:
            out.write(escape_controls(f"  warning: {warning}"))
    if not report.healthy:
        out.flush()
        sys.exit(1)


def _count(value: int, lag: GroupLag) -> str:
    capped = any(p.pending_capped for p in lag.partitions)
    return f">={value}" if capped else str(value)
