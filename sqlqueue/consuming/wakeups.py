"""What wakes a runner for its topics before its next poll (``SQLQUEUE["WAKEUPS"]``):
publishes committed in this process, PostgreSQL ``LISTEN`` on a connection of its own,
and Redis pub/sub when ``WAKEUP_REDIS_URL`` is set."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from django.db import connections

from sqlqueue import wakeups
from sqlqueue.conf import QueueSettings
from sqlqueue.consuming.clock import SYSTEM_CLOCK, HostClock
from sqlqueue.wakeups.listener import Listener

logger = logging.getLogger("sqlqueue.wakeups")


class Wakeups:
    """The wake-up sources of one runner; ``stop()`` ends them all."""

    def __init__(self, conf: QueueSettings, alias: str, topics: Iterable[str],
                 ring: wakeups.Ring, host_clock: HostClock = SYSTEM_CLOCK) -> None:
        self.topics = frozenset(topics)
        self.listeners: list[Listener] = []
        self._unsubscribe: Callable[[], None] | None = None
        if conf.WAKEUPS and self.topics:
            self._unsubscribe = wakeups.subscribe(self.topics, ring)
            self.listeners = _listeners(conf, alias, self.topics, ring, host_clock)
        for listener in self.listeners:
            listener.start()

    def cover_other_processes(self) -> bool:
        """Is a channel that hears other processes' publishes subscribed now (PostgreSQL
        ``LISTEN``, Redis)? Then each of their commits rings the runner, and quick polls
        after traffic would only cost passes (``Pacing._polling_delay``)."""
        return any(listener.connected.is_set() and listener.deaf is None
                   for listener in self.listeners)

    def keep_alive(self, send: Callable[[], None]) -> None:
        """``send`` one heartbeat (a notification on the channel, from the runner's own
        connection) when a listener has heard nothing for a while and asks for one
        (``Listener.wants_heartbeat``): a listener that does not hear it either is deaf.
        A busy channel sends none."""
        wanting = [listener for listener in self.listeners if listener.wants_heartbeat()]
        if not wanting:
            return
        # Marked sent before it goes: its echo may be heard before send() returns.
        before = [listener.heartbeat_sent() for listener in wanting]
        try:
            send()
        except BaseException:
            for listener, sent_at in zip(wanting, before, strict=True):
                listener.heartbeat_sent_at = sent_at  # none went: nothing to wait for
            raise

    def deaf(self) -> list[str]:
        """What each listener found deaf (not hearing again yet) says."""
        return [listener.deaf for listener in self.listeners if listener.deaf is not None]

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for listener in self.listeners:
            listener.stop()


def _listeners(conf: QueueSettings, alias: str, topics: frozenset[str],
               ring: wakeups.Ring, host_clock: HostClock) -> list[Listener]:
    found: list[Listener] = []
    if connections[alias].vendor == "postgresql":
        from sqlqueue.wakeups.postgresql import PostgreSQLListener, connection_params

        found.append(PostgreSQLListener(connection_params(conf.listen_alias_for(alias)),
                                        topics, ring, alias=alias,
                                        listener_alias=conf.has_listen_alias(alias),
                                        host_clock=host_clock))
    if conf.WAKEUP_REDIS_URL:
        from sqlqueue.wakeups.redis_channel import RedisListener

        found.append(RedisListener(conf.WAKEUP_REDIS_URL, topics, ring,
                                   host_clock=host_clock))
    return found


def describe_channels(conf: QueueSettings, alias: str) -> str:
    """What wakes a runner on ``alias`` before its next poll, in the words of the start-up
    banner (``runconsumer``): a newcomer sees whether other processes' publishes reach it
    at once or only at the next poll."""
    poll = f"otherwise a poll every {conf.POLL_INTERVAL:g} s"
    if not conf.WAKEUPS:
        return f"none (SQLQUEUE['WAKEUPS'] is False): a poll every {conf.POLL_INTERVAL:g} s"
    channels = ["publishes of this process"]
    if connections[alias].vendor == "postgresql":
        channels.append(f"PostgreSQL LISTEN on {conf.listen_alias_for(alias)!r}")
    if conf.WAKEUP_REDIS_URL:
        channels.append("Redis pub/sub (WAKEUP_REDIS_URL)")
    if len(channels) == 1:
        return (f"{channels[0]} only ({connections[alias].vendor} has no NOTIFY and "
                f"WAKEUP_REDIS_URL is not set); {poll}")
    return f"{', '.join(channels)}; {poll}"
