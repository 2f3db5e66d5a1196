"""Redis pub/sub wake-ups, for databases without ``NOTIFY`` (MySQL, MariaDB) when Redis
runs anyway: publishers ``PUBLISH`` each topic after commit, runners ``SUBSCRIBE`` in a
daemon thread. Redis is only ever a hint: when it is down, publishing and consuming go on
(logged once), and runners wake up by polling.

One channel per topic, ``sqlqueue:<topic>``, so a runner hears only its own topics.
Pub/sub ignores Redis's logical databases: projects sharing a Redis server and topic
names wake each other's runners for nothing (one cheap poll each).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from sqlqueue.clocks import SYSTEM_CLOCK, HostClock
from sqlqueue.naming import redacted_url, without_secrets
from sqlqueue.wakeups.listener import STOP_CHECK, Listener

logger = logging.getLogger("sqlqueue.wakeups")

CHANNEL_PREFIX = "sqlqueue:"
#: a publisher gives up on an unresponsive Redis after this long (seconds)...
PUBLISH_TIMEOUT = 0.25
#: ...and then publishes nothing for this long, doubling up to the maximum: a Redis that
#: does not answer costs a publisher one timeout per period, not one per commit
QUIET_AFTER_FAILURE = (1.0, 30.0)


def channel(topic: str) -> str:
    return CHANNEL_PREFIX + topic


def _client(url: str, timeout: float | None) -> Any:
    import redis

    # TCP keepalive only over TCP: redis-py's unix socket connection refuses the option.
    tcp = {} if url.startswith("unix://") else {"socket_keepalive": True}
    return redis.Redis.from_url(url, socket_connect_timeout=timeout or 2.0,
                                socket_timeout=timeout, health_check_interval=30, **tcp)


class Publisher:
    """``PUBLISH``es committed topics to one Redis; thread-safe (redis-py's pool)."""

    def __init__(self, url: str, host_clock: HostClock = SYSTEM_CLOCK) -> None:
        self.url = url
        self.host_clock = host_clock  # times the quiet spell after Redis failed
        self._client: Any = None
        self._quiet_until = 0.0
        self._quiet_for = 0.0
        self._lock = threading.Lock()

    def publish(self, topics: Iterable[str]) -> bool:
        """Publish each topic once; False (and nothing raised) when Redis is unavailable."""
        if self.host_clock.monotonic() < self._quiet_until:
            return False
        try:
            pipeline = self._connected().pipeline(transaction=False)
            for topic in topics:
                pipeline.publish(channel(topic), topic)
            pipeline.execute()
        except Exception as exc:  # no Redis, no package, a timeout: never the caller's
            self._failed(exc)
            return False
        if self._quiet_for:
            logger.info("Redis wake-ups are published again (%s).", redacted_url(self.url))
            self._quiet_for = 0.0
        return True

    def _connected(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = _client(self.url, PUBLISH_TIMEOUT)
            return self._client

    def _failed(self, exc: BaseException) -> None:
        first, longest = QUIET_AFTER_FAILURE
        if not self._quiet_for:
            logger.warning("Cannot publish wake-ups to Redis (%s): %s. Messages are still "
                           "published; runners find them by polling until Redis is back.",
                           redacted_url(self.url), without_secrets(str(exc), self.url))
        self._quiet_for = min(longest, 2 * self._quiet_for) if self._quiet_for else first
        self._quiet_until = self.host_clock.monotonic() + self._quiet_for


_publishers: dict[str, Publisher] = {}
_publishers_lock = threading.Lock()


def publish(url: str, topics: Iterable[str]) -> bool:
    """Wake the runners of ``topics`` listening on the Redis at ``url``."""
    with _publishers_lock:
        publisher = _publishers.get(url)
        if publisher is None:
            publisher = _publishers[url] = Publisher(url)
    return publisher.publish(topics)


class RedisListener(Listener):
    channel = "Redis wake-up"

    def __init__(self, url: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.url = url

    def described(self, exc: BaseException) -> str:
        """redis-py's errors may quote the URL (a port parsed out of a password)."""
        return without_secrets(str(exc), self.url)

    def listen(self) -> None:
        client = _client(self.url, None)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(*(channel(topic) for topic in self.topics))
            self.listening()
            while not self.stopping.is_set():
                # health_check_interval makes an idle wait PING now and then, so a dead
                # connection raises here rather than staying silent forever.
                message = pubsub.get_message(timeout=STOP_CHECK)
                if message is not None and message.get("type") == "message":
                    name = message["channel"]
                    name = name.decode() if isinstance(name, bytes) else str(name)
                    self.heard(name[len(CHANNEL_PREFIX):])
        finally:
            pubsub.close()
            client.close()
