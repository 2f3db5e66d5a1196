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
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections, transaction
from django.db.models import Max

from sqlqueue import storage
from sqlqueue.conf import MAX_NAME_BYTES, get_settings
from sqlqueue.exceptions import SqlqueueError
from sqlqueue.models import RunnerAction, RunnerRequest, SubscriberHeartbeat

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


#: how long a runner stopped at an operator's request stays listed on the admin's page
STOPPED_SHOWN_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class StoppedRunner:
    """A runner that obeyed an operator's request and is no longer live."""

    runner: str
    action: str  # "drain" or "stop"
    requested_by: str
    requested_at_ms: int
    obeyed_at_ms: int

    @property
    def description(self) -> str:
        return RunnerAction(self.action).label


def stopped_runners(*, using: str | None = None,
                    shown_ms: int = STOPPED_SHOWN_MS) -> list[StoppedRunner]:
    """The runners that obeyed a request in the last ``shown_ms`` (database time) and
    have no live heartbeat now, the latest first: what the Subscribers page lists after
    a drain or a stop, with who asked and when (one row per runner name, so few)."""
    alias = using or get_settings().DATABASE
    since = _database_now(alias) - shown_ms
    live = set(live_runners(using=alias))
    rows = (RunnerRequest.objects.using(alias).filter(obeyed_at__gte=since)
            .exclude(obeyed_at=0).order_by("-obeyed_at")
            .values_list("runner_name", "action", "requested_by", "requested_at",
                         "obeyed_at"))
    return [StoppedRunner(*row) for row in rows if row[0] not in live]


def refuse_a_live_namesake(name: str, *, using: str | None = None,
                           sleep: Callable[[float], None] = time.sleep,
                           monotonic: Callable[[], float] = time.monotonic) -> None:
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
