"""The daemon thread a runner listens on for wake-ups from other processes: connect,
listen until told to stop, and after a lost connection reconnect with backoff. Polling
goes on meanwhile, so an outage costs latency, never a message.

A session can also go deaf without being lost: connected, but hearing nothing (its
server process frozen, a proxy that stopped forwarding). Nothing fails then, and wake-ups
silently stop (the wave-4 rerun: latency at the poll interval, nothing logged). So a
listener that ``heartbeats`` asks its runner for a heartbeat once it has heard nothing for
``HEARTBEAT_AFTER`` seconds (the runner's main connection sends one notification on the
channel, ``Wakeups.keep_alive``); if not even that is heard within ``ECHO_WAIT``, the
listener says so once, stops counting as a channel (polls cover the gap) and listens
again on a new session.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from sqlqueue.clocks import SYSTEM_CLOCK, HostClock
from sqlqueue.exceptions import SqlqueueError
from sqlqueue.wakeups import Ring

logger = logging.getLogger("sqlqueue.wakeups")

#: seconds between attempts to reconnect, after the first, second... failure
RELISTEN_BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
#: how often a listening thread checks whether it was asked to stop (seconds)
STOP_CHECK = 0.5
#: seconds of hearing nothing after which a listener that ``heartbeats`` asks its runner
#: for a heartbeat (one notification on the channel, from the runner's own connection)
HEARTBEAT_AFTER = 5.0
#: seconds a heartbeat may take to be heard before the session is taken for deaf
ECHO_WAIT = 5.0


class ChannelOff(SqlqueueError):
    """Raised by ``listen`` when the channel cannot work as configured (a LISTEN through
    a transaction pooler): the thread logs it once and ends, without retrying; the runner
    keeps polling as if it had no such channel."""


class SilentChannel(SqlqueueError):
    """The session heard nothing, not even a heartbeat sent ``ECHO_WAIT`` ago."""


class Listener(threading.Thread):
    """Rings ``ring(topic)`` for every wake-up of one of ``topics`` that ``listen`` hears.

    Subclasses implement ``listen``: connect, call ``self.listening()`` once subscribed,
    then hand each wake-up to ``self.heard(topic)`` until ``self.stopping`` is set; any
    exception is a lost connection, except ``ChannelOff``."""

    #: what the log calls this channel
    channel = "wake-up"
    #: the runner's heartbeats reach this channel (PostgreSQL NOTIFY): its silence is
    #: checked (``check_echo``)
    heartbeats = False

    def __init__(self, topics: Iterable[str], ring: Ring, *,
                 host_clock: HostClock = SYSTEM_CLOCK) -> None:
        super().__init__(name=f"sqlqueue-{self.channel}-listener", daemon=True)
        #: what times the channel's silence (the runner's: a test passes a manual one)
        self.host_clock = host_clock
        self.topics = frozenset(topics)
        self.ring = ring
        self.stopping = threading.Event()
        #: set while subscribed (tests and probes wait on it)
        self.connected = threading.Event()
        #: how many times a subscription was made (the first, then each reconnect)
        self.connections = 0
        #: when something was last heard, and a heartbeat last asked for (monotonic)
        self.last_heard = 0.0
        self.heartbeat_sent_at = 0.0
        #: how many times the session was found deaf (and replaced)
        self.silences = 0
        #: while deaf, a sentence for ``queue health`` (None: hearing, or not connected)
        self.deaf: str | None = None

    def run(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            try:
                self.listen()
                failures = 0
            except ChannelOff as off:
                logger.warning("%s", off)
                break
            except SilentChannel as silent:
                self.connected.clear()
                # Once per episode: the next session is heard, or found deaf again.
                self.silences += 1
                self.deaf = str(silent)
                logger.warning("%s", silent)
                self.stopping.wait(RELISTEN_BACKOFF[0])
            except Exception as exc:  # any failure is a lost connection: retry
                self.connected.clear()
                delay = RELISTEN_BACKOFF[min(failures, len(RELISTEN_BACKOFF) - 1)]
                # Once per outage at WARNING: a channel that stays down must not flood
                # the log; polling carries on meanwhile.
                level = logging.WARNING if failures == 0 else logging.DEBUG
                logger.log(level, "The %s channel is unavailable (%s); waking up by polling "
                           "until it is back (next try in %.1fs).", self.channel,
                           self.described(exc), delay)
                failures += 1
                self.stopping.wait(delay)
        self.connected.clear()

    def listening(self) -> None:
        """Subscribed: wake every topic once, since what was published while this thread
        was not listening (or before it first was) rang nobody."""
        if self.connections:
            logger.info("The %s channel is back.", self.channel)
        self.connections += 1
        self.last_heard = self.host_clock.monotonic()
        self.heartbeat_sent_at = 0.0
        self.connected.set()
        for topic in self.topics:
            self.ring(topic)

    def heard(self, topic: str) -> None:
        """A notification (a topic's wake-up, or a heartbeat: proof the session hears)."""
        self.last_heard = self.host_clock.monotonic()
        if self.deaf is not None:
            logger.info("The %s channel hears again.", self.channel)
            self.deaf = None
        if topic in self.topics:
            self.ring(topic)

    def wants_heartbeat(self) -> bool:
        """Subscribed, heard nothing for ``HEARTBEAT_AFTER`` seconds, and no heartbeat
        asked for since: the runner should send one (then ``heartbeat_sent``)."""
        if not (self.heartbeats and self.connected.is_set()):
            return False
        now = self.host_clock.monotonic()
        return (now - self.last_heard >= HEARTBEAT_AFTER
                and self.heartbeat_sent_at <= self.last_heard)

    def heartbeat_sent(self) -> float:
        """A heartbeat goes now (marked before it is sent: its echo may come first).
        Returns the mark it replaces."""
        before, self.heartbeat_sent_at = self.heartbeat_sent_at, self.host_clock.monotonic()
        return before

    def check_echo(self) -> None:
        """After reading what arrived: a heartbeat sent ``ECHO_WAIT`` ago and nothing
        heard since means a deaf session (``SilentChannel``)."""
        sent = self.heartbeat_sent_at
        if sent > self.last_heard and self.host_clock.monotonic() - sent >= ECHO_WAIT:
            silent_for = self.host_clock.monotonic() - self.last_heard
            raise SilentChannel(
                f"The {self.channel} channel heard nothing for {silent_for:.0f}s, not even "
                f"this runner's heartbeat sent {ECHO_WAIT:g}s ago: its session is connected "
                "but deaf (a frozen server process, a proxy that stopped forwarding). "
                "Listening again on a new session; polls cover the gap meanwhile.")

    def listen(self) -> None:
        raise NotImplementedError

    def described(self, exc: BaseException) -> str:
        """What the log says of a lost connection (a subclass leaves secrets out)."""
        return str(exc)

    def stop(self) -> None:
        """Ask the thread to stop; it does within ``STOP_CHECK`` seconds (a daemon: the
        process never waits for it longer than that)."""
        self.stopping.set()
        self.join(timeout=2 * STOP_CHECK)
