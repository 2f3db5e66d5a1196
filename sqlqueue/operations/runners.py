"""Runner control (issue 42): ask a running ``runconsumer``, by its subscriber name, to
drain and stop or to stop at once.

The request is a row of ``queue_runner_requests``; the runner reads its own row once per
``LEASE_RENEW_INTERVAL`` (``sqlqueue.consuming.control``), so it obeys within one renew
interval, logs who asked, and stamps the row obeyed. **Drain and stop** is what SIGTERM
does: nothing new is taken, queued messages are given back, running handlers finish (up
to ``SHUTDOWN_TIMEOUT``), their outcomes are recorded and the partitions handed over.
**Stop at once** does the same without waiting for running handlers: their messages are
delivered again after their visibility timeout (at least once, as after a crash).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections, transaction
from django.db.models import Max

from sqlqueue import storage
from sqlqueue.clocks import SYSTEM_CLOCK
from sqlqueue.conf import MAX_NAME_BYTES, get_settings
from sqlqueue.consuming.control import STOPPED_KEPT_MS
from sqlqueue.exceptions import SqlqueueError
from sqlqueue.models import RunnerAction, RunnerRequest, RunnerStopCause, SubscriberHeartbeat

ACTIONS = {"drain": RunnerAction.DRAIN, "stop": RunnerAction.STOP}


logger = logging.getLogger("sqlqueue.consumer")


class NotARunningRunner(SqlqueueError, LookupError):
    """No live runner has that name (it stopped, or never ran), or the action is unknown."""


class RunnerNameTaken(SqlqueueError):
    """Another live runner has this name: a stop request, a lease or a heartbeat would not
    tell the two apart."""


@dataclass(frozen=True)
class PendingRequest:
    runner: str
    action: str  # "drain" or "stop"
    requested_by: str
    requested_at_ms: int

    @property
    def description(self) -> str:
        return RunnerAction(self.action).label


def live_runners(*, using: str | None = None) -> list[str]:
    """The names of the runners with a live heartbeat (in any subscription), sorted."""
    alias = using or get_settings().DATABASE
    with connections[alias].cursor() as cursor:
        now = storage.store(alias).database_now_ms(cursor)
    since = now - int(get_settings().LEASE_DURATION * 1000)
    return sorted(set(SubscriberHeartbeat.objects.using(alias).filter(
        heartbeat_at__gte=since, deregistered_at=0).values_list("subscriber_name", flat=True)))


def request_runner_stop(runner: str, action: str, *, by: str = "",
                        using: str | None = None) -> PendingRequest:
    """Ask the live runner ``runner`` to ``drain`` (and stop) or to ``stop`` at once. A
    request not obeyed yet is replaced (the latest word counts)."""
    if action not in ACTIONS:
        raise NotARunningRunner(f"Unknown action {action!r}: 'drain' (drain and stop) or "
                                "'stop' (stop at once).")
    alias = using or get_settings().DATABASE
    if len(runner.encode("utf-8")) > MAX_NAME_BYTES or runner not in live_runners(using=alias):
        raise NotARunningRunner(
            f"No live runner named {runner!r}: it stopped, or never ran (the names are "
            "those of the admin's Subscribers and leases page).")
    connection = connections[alias]
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        now = storage.store(connection).database_now_ms(cursor)
        RunnerRequest.objects.using(alias).update_or_create(
            runner_name=runner, defaults={"action": ACTIONS[action], "requested_at": now,
                                          "requested_by": by[:255], "obeyed_at": 0})
    return PendingRequest(runner, action, by[:255], now)


def pending_requests(*, using: str | None = None) -> list[PendingRequest]:
    """The requests no runner has obeyed yet, oldest first."""
    alias = using or get_settings().DATABASE
    return [PendingRequest(*row) for row in RunnerRequest.objects.using(alias)
            .filter(obeyed_at=0).order_by("requested_at")
            .values_list("runner_name", "action", "requested_by", "requested_at")]


#: how long a stopped runner stays listed on the admin's page (its row is kept that long)
STOPPED_SHOWN_MS = STOPPED_KEPT_MS
#: the cause of a runner found dead: its heartbeat stopped with no goodbye (no row says so)
FOUND_DEAD = "dead"


@dataclass(frozen=True)
class StoppedRunner:
    """A runner that stopped and is no longer live: asked to by an operator, or stopped
    for another ``cause`` (``RunnerStopCause``, or ``FOUND_DEAD``), with when it was told
    (``requested_at_ms``; a dead one's last heartbeat) and when it had stopped
    (``obeyed_at_ms``; a dead one's lease expiry)."""

    runner: str
    action: str  # "drain" or "stop"
    requested_by: str
    requested_at_ms: int
    obeyed_at_ms: int
    cause: str = RunnerStopCause.REQUEST

    @property
    def description(self) -> str:
        """What stopped it, in words (the admin's Runners table)."""
        by = self.requested_by
        if self.cause == RunnerStopCause.REQUEST:
            return f"asked to {RunnerAction(self.action).label} by {by or 'an operator'}"
        if self.cause == RunnerStopCause.SIGNAL:
            how = "at once" if self.action == RunnerAction.STOP else "drained"
            return f"by the signal {by} ({how})"
        if self.cause == RunnerStopCause.RECYCLE:
            return f"recycled by its supervisor ({by})"
        if self.cause == FOUND_DEAD:
            return ("found dead: its heartbeat stopped with no goodbye (it crashed or was "
                    "killed); its leases expired")
        return RunnerStopCause(self.cause).label

    @property
    def found_dead(self) -> bool:
        return self.cause == FOUND_DEAD


def stopped_runners(*, using: str | None = None,
                    shown_ms: int = STOPPED_SHOWN_MS) -> list[StoppedRunner]:
    """The runners that stopped in the last ``shown_ms`` (database time) and have no live
    heartbeat now, the latest first: what the Subscribers page lists, with what stopped
    them and when (one row per runner name, so few). Those that said why are rows of
    ``queue_runner_requests``; one whose heartbeats outlived it with no such row since
    (killed, crashed, the power went) is found dead, until garbage collection of its
    heartbeats (``PURGE_AFTER_LEASES`` lease durations)."""
    alias = using or get_settings().DATABASE
    live = set(live_runners(using=alias))
    return [r for r in _last_stops(alias, shown_ms) if r.runner not in live]


def earlier_stops(*, using: str | None = None,
                  shown_ms: int = STOPPED_SHOWN_MS) -> dict[str, StoppedRunner]:
    """By live runner name: how the last process of that name stopped, if it did in the
    last ``shown_ms`` (a supervisor's recycled worker, a restarted service)."""
    alias = using or get_settings().DATABASE
    live = set(live_runners(using=alias))
    return {r.runner: r for r in _last_stops(alias, shown_ms) if r.runner in live}


def _last_stops(alias: str, shown_ms: int) -> list[StoppedRunner]:
    now = _database_now(alias)
    rows = (RunnerRequest.objects.using(alias).filter(obeyed_at__gte=now - shown_ms)
            .exclude(obeyed_at=0)
            .values_list("runner_name", "action", "requested_by", "requested_at",
                         "obeyed_at", "cause"))
    stops = {row[0]: StoppedRunner(*row) for row in rows}
    lease_ms = int(get_settings().LEASE_DURATION * 1000)
    beats = (SubscriberHeartbeat.objects.using(alias)
             .filter(deregistered_at=0, heartbeat_at__gte=now - shown_ms)
             .values("subscriber_name").annotate(last=Max("heartbeat_at"))
             .values_list("subscriber_name", "last"))
    for name, last in beats:
        known = stops.get(name)
        if last < now - lease_ms and (known is None or known.obeyed_at_ms < last):
            stops[name] = StoppedRunner(name, RunnerAction.STOP, "", last, last + lease_ms,
                                        FOUND_DEAD)
    return sorted(stops.values(), key=lambda r: r.obeyed_at_ms, reverse=True)


def refuse_a_live_namesake(name: str, *, using: str | None = None,
                           sleep: Callable[[float], None] = SYSTEM_CLOCK.sleep,
                           monotonic: Callable[[], float] = SYSTEM_CLOCK.monotonic) -> None:
    """Before a runner named ``name`` starts: raise ``RunnerNameTaken`` if another runner
    of that name is running. Two would share their heartbeats and leases (both taking a
    partition for their own), and a stop request would reach whichever read it first.

    A live heartbeat of the name may also be that of a process that crashed a moment ago
    (a supervisor restarting it under its name): it is alive only if its heartbeat moves.
    So with one found, this waits up to one and a half ``LEASE_RENEW_INTERVAL`` (a live
    runner heartbeats every interval) and refuses only if it moved meanwhile."""
    alias = using or get_settings().DATABASE
    renew = float(get_settings().LEASE_RENEW_INTERVAL)
    first = _last_heartbeat(name, alias)
    if first is None:
        return
    logger.info("A runner named %r heartbeated %.1fs ago: waiting up to %.1fs to see "
                "whether it is still running (a runner that crashed stops heartbeating).",
                name, max(0, _database_now(alias) - first) / 1000, 1.5 * renew)
    deadline = monotonic() + 1.5 * renew
    while monotonic() < deadline:
        sleep(min(0.25, renew / 4))
        last = _last_heartbeat(name, alias)
        if last is None:
            return  # it stopped
        if last > first:
            raise RunnerNameTaken(
                f"A runner named {name!r} is running (its heartbeat moved while this one "
                "waited to start): two runners of one name would share their leases, and "
                "a stop request would reach only one. Give this one another --name, or "
                "stop that one first (the admin's Subscribers page, or SIGTERM).")


def _last_heartbeat(name: str, alias: str) -> int | None:
    """The latest live heartbeat of ``name``, in any subscription (None: none live)."""
    since = _database_now(alias) - int(get_settings().LEASE_DURATION * 1000)
    latest: int | None = SubscriberHeartbeat.objects.using(alias).filter(
        subscriber_name=name, heartbeat_at__gte=since, deregistered_at=0,
    ).aggregate(latest=Max("heartbeat_at"))["latest"]
    return latest


def _database_now(alias: str) -> int:
    with connections[alias].cursor() as cursor:
        return storage.store(alias).database_now_ms(cursor)
