"""The daemon thread a runner listens on for wake-ups from other processes: connect,
listen until told to stop, and after a lost connection reconnect with backoff. Polling
goes on meanwhile, so an outage costs latency, never a message."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from sqlqueue.exceptions import SqlqueueError
from sqlqueue.wakeups import Ring

logger = logging.getLogger("sqlqueue.wakeups")

#: seconds between attempts to reconnect, after the first, second... failure
RECONNECT_BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
#: how often a listening thread checks whether it was asked to stop (seconds)
STOP_CHECK = 0.5


class ChannelOff(SqlqueueError):
    """Raised by ``listen`` when the channel cannot work as configured (a LISTEN through
    a transaction pooler): the thread logs it once and ends, without retrying; the runner
    keeps polling as if it had no such channel."""


class Listener(threading.Thread):
    """Rings ``ring(topic)`` for every wake-up of one of ``topics`` that ``listen`` hears.

    Subclasses implement ``listen``: connect, call ``self.listening()`` once subscribed,
    then hand each wake-up to ``self.heard(topic)`` until ``self.stopping`` is set; any
    exception is a lost connection, except ``ChannelOff``."""

    #: what the log calls this channel
    channel = "wake-up"

    def __init__(self, topics: Iterable[str], ring: Ring) -> None:
        super().__init__(name=f"sqlqueue-{self.channel}-listener", daemon=True)
        self.topics = frozenset(topics)
        self.ring = ring
        self.stopping = threading.Event()
        #: set while subscribed (tests and probes wait on it)
        self.connected = threading.Event()
        #: how many times a subscription was made (the first, then each reconnect)
        self.connections = 0

    def run(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            try:
                self.listen()
                failures = 0
            except ChannelOff as off:
                logger.warning("%s", off)
                break
            except Exception as exc:  # any failure is a lost connection: retry
                self.connected.clear()
                delay = RECONNECT_BACKOFF[min(failures, len(RECONNECT_BACKOFF) - 1)]
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
        self.connected.set()
        for topic in self.topics:
            self.ring(topic)

    def heard(self, topic: str) -> None:
        if topic in self.topics:
            self.ring(topic)

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
