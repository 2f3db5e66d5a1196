"""Is the queue healthy? For ``manage.py queue health`` (liveness/readiness probes).

Unhealthy: the database cannot be reached, migrations are not applied, or a selected
subscription is in STOP or STALL (the lag service's rules). WARN is healthy: a group that
falls behind or has dead letters needs a look, not a restart.

``runner_alive`` reads the liveness file a ``runconsumer --liveness-file`` touches at each
turn of its loop: a probe of the process that needs no database.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from sqlqueue.clocks import SYSTEM_CLOCK, HostClock
from sqlqueue.conf import get_settings
from sqlqueue.consuming import liveness
from sqlqueue.operations.state import SubscriptionState, subscription_states
from sqlqueue.operations.unconsumed import unconsumed_topics

UNHEALTHY = ("STOP", "STALL")


@dataclass
class HealthReport:
    healthy: bool = True
    reasons: list[str] = field(default_factory=list)
    subscriptions: list[dict[str, Any]] = field(default_factory=list)
    #: worth a look, not a restart: still healthy (topics nobody consumes)
    warnings: list[str] = field(default_factory=list)

    def fail(self, reason: str) -> None:
        self.healthy = False
        self.reasons.append(reason)

    def as_dict(self) -> dict[str, Any]:
        return {"status": "healthy" if self.healthy else "unhealthy", **asdict(self)}


def queue_health(using: str | None = None, group: str | None = None,
                 topic: str | None = None) -> HealthReport:
    """Healthy when the database ``using`` (None: every database the queue lives in,
    ``SQLQUEUE["DATABASE"]`` and the aliases of ``ROUTES``) is reachable and migrated,
    and no selected subscription is in STOP or STALL."""
    report = HealthReport()
    aliases = [using] if using else list(get_settings().databases)
    matched = False
    for alias in aliases:
        failures = len(report.reasons)
        states = _states_of(report, alias, group, topic)
        matched = matched or bool(states)
        for s in states:
            _judge(report, s)
        if group is None and len(report.reasons) == failures:  # reachable and migrated
            _warn_unconsumed(report, alias, topic)
    if (group or topic) and not matched and report.healthy:
        report.fail("no subscription matches " + " and ".join(
            f"{name} {value!r}" for name, value in (("group", group), ("topic", topic))
            if value))
    return report


def _states_of(report: HealthReport, alias: str, group: str | None,
               topic: str | None) -> list[SubscriptionState]:
    """The subscriptions of one database, or none (and a reason) when it is unreachable
    or not migrated."""
    connection = connections[alias]
    try:
        connection.ensure_connection()
        executor = MigrationExecutor(connection)
        unapplied = [f"{m.app_label}.{m.name}" for m, _ in
                     executor.migration_plan(executor.loader.graph.leaf_nodes())]
    except DatabaseError as exc:
        report.fail(f"database {alias!r} unreachable: {exc}")
        return []
    if unapplied:
        report.fail(f"{len(unapplied)} unapplied migration(s) on {alias!r}: "
                    f"{', '.join(unapplied)}; run manage.py migrate --database {alias}")
        return []
    try:
        return subscription_states(alias, group, topic)
    except DatabaseError as exc:
        report.fail(f"database {alias!r} unreachable: {exc}")
        return []


def _warn_unconsumed(report: HealthReport, alias: str, topic: str | None) -> None:
    """Topics with messages and no consumer group (a misspelt topic, a consumers.py
    outside INSTALLED_APPS): a warning, not unhealthy."""
    for row in unconsumed_topics(alias):
        if topic in (None, row.topic):
            report.warnings.append(f"{row.describe()} on {alias!r}")


def _judge(report: HealthReport, s: SubscriptionState) -> None:
    status = s.lag.status
    report.subscriptions.append({
        "group": s.group, "topic": s.topic, "database": s.database, "status": status,
        "pending": s.lag.pending, "pending_capped": s.lag.pending_capped,
        "oldest_pending_seconds": s.lag.oldest_pending_age,
        "dead_letters": s.lag.dead_letters, "live_subscribers": s.live_subscribers})
    if status in UNHEALTHY:
        stuck = [p.partition_key for p in s.lag.partitions if p.status == status]
        report.fail(f"{s.group} on {s.topic} is {status} ({len(stuck)} partition(s), "
                    f"first {stuck[0]!r})" if stuck else f"{s.group} on {s.topic} is "
                    f"{status}")


def runner_alive(path: str, max_age: float,
                 host_clock: HostClock = SYSTEM_CLOCK) -> HealthReport:
    """Healthy when ``path`` was touched less than ``max_age`` seconds ago (by this
    host's wall clock, the one that stamps the file: ``host_clock.wall``)."""
    report = HealthReport()
    try:
        age = host_clock.wall() - os.stat(path).st_mtime
    except OSError as exc:
        report.fail(f"liveness file {path!r} unreadable: {exc.strerror}")
        return report
    report.subscriptions = []
    if age > max_age:
        report.fail(f"runconsumer loop last turned {age:.1f}s ago (more than {max_age:g}s)")
    with contextlib.suppress(OSError):
        report.warnings += liveness.notes(path)  # healthy: polls cover a deaf listener
    return report

