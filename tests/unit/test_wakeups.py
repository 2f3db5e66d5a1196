"""Wake-ups without a database: the in-process registry, the runner's Doorbell (many
rings are one wake-up, never sooner than the quickest poll), the listeners' reconnects,
a Redis that is down, and the settings."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from sqlqueue import wakeups
from sqlqueue.conf import validate
from sqlqueue.wakeups import Doorbell
from sqlqueue.wakeups.listener import Listener
from sqlqueue.wakeups.redis_channel import Publisher

ALIASES = {"default": {"ENGINE": "django.db.backends.postgresql"},
           "session": {"ENGINE": "django.db.backends.postgresql"},
           "lite": {"ENGINE": "django.db.backends.sqlite3"}}


# -- the registry -----------------------------------------------------------------------
def test_ring_calls_the_subscribers_of_its_topics_only() -> None:
    heard: list[str] = []
    unsubscribe = wakeups.subscribe(["a", "b"], heard.append)
    try:
        assert wakeups.ring(["a", "c", "a"]) == 1  # a set: "a" once, nobody on "c"
        assert wakeups.ring(["b"]) == 1
    finally:
        unsubscribe()
    assert heard == ["a", "b"]
    assert wakeups.ring(["a", "b"]) == 0  # unsubscribed


def test_a_failing_subscriber_does_not_stop_the_others(caplog: Any) -> None:
    heard: list[str] = []

    def broken(topic: str) -> None:
        raise RuntimeError("boom")

    stops = [wakeups.subscribe(["t"], broken), wakeups.subscribe(["t"], heard.append)]
    try:
        with caplog.at_level(logging.ERROR, "sqlqueue.wakeups"):
            assert wakeups.ring(["t"]) == 2
    finally:
        for stop in stops:
            stop()
    assert heard == ["t"]
    assert "A wake-up subscriber of 't' failed" in caplog.text


# -- the Doorbell -------------------------------------------------------------------------
def test_many_rings_are_one_wakeup() -> None:
    bell = Doorbell(min_gap=0.001)
    for _ in range(1000):
        bell.ring("t")
    assert bell.wait(30) is True
    bell.clear()
    assert bell.wakeups == 1
    assert bell.wait(0.01) is False  # nothing left over from the storm
    assert bell.wakeups == 1


def test_a_ring_never_ends_a_wait_sooner_than_the_min_gap() -> None:
    bell = Doorbell(min_gap=0.2)
    bell.ring("t")  # rung during the pass: the next wait still lasts min_gap
    started = time.monotonic()
    assert bell.wait(30) is True
    assert time.monotonic() - started >= 0.2  # a lower bound: a slow machine only adds
    assert bell.wakeups == 1, "the ring did not end the wait before its timeout"


def test_a_ring_ends_a_wait_that_gathers_nothing_at_once() -> None:
    bell = Doorbell(min_gap=3600)  # an hour: only an ungathered ring ends it in the test
    bell.ring("t")  # rung during a pass that delivered nothing
    assert bell.wait(7200, coalesce=False) is True
    assert bell.wakeups == 1


def test_a_ring_from_another_thread_ends_a_long_wait() -> None:
    bell = Doorbell(min_gap=0.002)
    ringer = threading.Thread(target=lambda: (_until(lambda: bell.waiting), bell.ring("t")))
    ringer.start()
    assert bell.wait(30) is True
    ringer.join()
    assert bell.wakeups == 1, "the ring did not end the wait before its timeout"


def test_set_ends_a_wait_at_once_even_inside_the_min_gap() -> None:
    bell = Doorbell(min_gap=3600)  # an hour: only ``set`` can end the wait within the test
    bell.ring("t")
    ended: list[bool] = []
    waiter = threading.Thread(target=lambda: ended.append(bell.wait(7200)), daemon=True)
    waiter.start()
    _until(lambda: bell.waiting)
    bell.set()
    waiter.join(60)  # bounds a hang only
    assert ended == [True], "set did not end a wait inside the min_gap"
    assert bell.wakeups == 0  # an urgent wake, not a publish


def test_a_wait_without_a_ring_lasts_its_timeout() -> None:
    bell = Doorbell(min_gap=0.001)
    started = time.monotonic()
    assert bell.wait(0.05) is False
    assert time.monotonic() - started >= 0.05


def _until(condition: Any) -> None:
    deadline = time.monotonic() + 30  # bounds a hang only
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {condition}"
        time.sleep(0.001)


# -- the listeners' reconnect loop ---------------------------------------------------------
class FlakyListener(Listener):
    """Fails its first connection, then hears one wake-up and idles until stopped."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.attempts = 0

    def listen(self) -> None:
        self.attempts += 1
        if self.attempts == 1:
            raise ConnectionError("refused")
        self.listening()
        self.heard("other")  # not ours: ignored
        self.heard("t")
        self.stopping.wait()


def test_a_listener_reconnects_and_catches_up(caplog: Any) -> None:
    heard: list[str] = []
    listener = FlakyListener(["t"], heard.append)
    with caplog.at_level(logging.WARNING, "sqlqueue.wakeups"):
        listener.start()
        _until(listener.connected.is_set)
        _until(lambda: len(heard) == 2)
    listener.stop()
    assert not listener.is_alive()
    # One ring when it (re)connected (what was published meanwhile), one heard.
    assert heard == ["t", "t"]
    assert "channel is unavailable (refused)" in caplog.text


# -- Redis down ----------------------------------------------------------------------------
def test_a_redis_publisher_that_cannot_connect_logs_once_and_stays_quiet(caplog: Any) -> None:
    publisher = Publisher("redis://127.0.0.1:1/0")  # nothing listens on port 1
    with caplog.at_level(logging.WARNING, "sqlqueue.wakeups"):
        assert publisher.publish(["t"]) is False
        assert publisher.publish(["t"]) is False  # within its quiet period: not even tried
    assert caplog.text.count("Cannot publish wake-ups to Redis") == 1


class _FakeRedis:
    """A Redis client that fails while ``down`` and publishes otherwise."""

    def __init__(self) -> None:
        self.down = True

    def pipeline(self, transaction: bool) -> Any:
        if self.down:
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")
        return self

    def publish(self, channel: str, message: str) -> None:
        pass

    def execute(self) -> None:
        pass


def test_the_redis_password_never_reaches_the_log(caplog: Any) -> None:
    """N3: the WARNING when Redis is unreachable and the INFO when it is back show the
    URL with its password masked (in the authority and in the query)."""
    publisher = Publisher("redis://:Sup3rRedisPW@127.0.0.1:6390/0?password=Qu3ryPW&db=0")
    fake = publisher._client = _FakeRedis()
    with caplog.at_level(logging.INFO, "sqlqueue.wakeups"):
        assert publisher.publish(["t"]) is False
        fake.down = False
        publisher._quiet_until = 0.0
        assert publisher.publish(["t"]) is True
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO]
    assert "Sup3rRedisPW" not in caplog.text and "Qu3ryPW" not in caplog.text
    assert "redis://***@127.0.0.1:6390/0?password=***&db=0" in caplog.text


#: a password with an unencoded '/', '?' or '#': redis-py reads "Sup3r" as the port and
#: says so in its error (audit W3)
MALFORMED_REDIS_URLS = [f"redis://:Sup3r{cut}RedisPW@127.0.0.1:6390/0" for cut in "/?#"]
URL = "redis://u:Sup3r/RedisPW@h:6390/0?password=Qu3ryPW&db=0"


@pytest.mark.parametrize("url", MALFORMED_REDIS_URLS)
def test_no_part_of_a_malformed_urls_password_reaches_the_log(url: str, caplog: Any) -> None:
    """Audit W3, through the real redis.Redis.from_url: the publisher's WARNING and the
    listener's, whose error text quotes the password's first part."""
    from sqlqueue.wakeups.redis_channel import RedisListener, _client

    with pytest.raises(ValueError, match="Sup3r"):  # what redis-py says, unscrubbed
        _client(url, 0.25).publish("x", "y")
    listener = RedisListener(url, ["t"], lambda topic: None)
    with caplog.at_level(logging.WARNING, "sqlqueue.wakeups"):
        assert Publisher(url).publish(["t"]) is False
        listener.start()
        _until(lambda: "channel is unavailable" in caplog.text)
    listener.stop()
    assert [r.getMessage()[:30] for r in caplog.records] == [
        "Cannot publish wake-ups to Red", "The Redis wake-up channel is u"]
    assert "Sup3r" not in caplog.text and "RedisPW" not in caplog.text
    assert "Port could not be cast to integer value as '***'" in caplog.text


@pytest.mark.parametrize("url", MALFORMED_REDIS_URLS)
def test_a_malformed_redis_url_is_refused_by_the_settings(url: str) -> None:
    _, problems = validate({"WAKEUP_REDIS_URL": url}, ALIASES)
    assert [p.id for p in problems] == ["sqlqueue.E008"]
    assert "percent-encode them (%2F, %3F, %23" in problems[0].msg
    assert "Sup3r" not in problems[0].msg and "RedisPW" not in problems[0].msg


@pytest.mark.parametrize(("url", "text", "shown"), [
    (URL, "Port could not be cast to integer value as 'Sup3r'",
     "Port could not be cast to integer value as '***'"),
    (URL, "auth with Sup3r/RedisPW failed", "auth with *** failed"),
    (URL, "query Qu3ryPW", "query ***"),
    (URL, "nothing secret", "nothing secret"),
    # A piece too short to replace (it would match by chance) hides the whole text.
    ("redis://u:pw@h/0", "login pw refused", "<not shown: it may quote part of the URL's "
                                             "password>"),
    ("redis://u:pw@h/0", "nothing secret", "nothing secret"),
    ("redis://h:6379/0", "Sup3r", "Sup3r"),  # no secret in the URL: unchanged
])
def test_an_error_text_is_shown_without_any_piece_of_the_secrets(url: str, text: str,
                                                                 shown: str) -> None:
    from sqlqueue.naming import without_secrets

    assert without_secrets(text, url) == shown


def test_a_unix_socket_url_makes_a_client() -> None:
    """unix:// is an accepted scheme: its connection takes no TCP keepalive option."""
    from sqlqueue.wakeups.redis_channel import _client

    connection = _client("unix:///tmp/sqlqueue-no-such.sock?db=1", 0.25).connection_pool \
        .make_connection()
    assert type(connection).__name__ == "UnixDomainSocketConnection"


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:pw@h:6379/0", "redis://***@h:6379/0"),
    ("redis://user:pw@h/1", "redis://user:***@h/1"),
    ("redis://u:p/w?x#y@h/0", "redis://u:***@h/0"),  # unencoded / ? # in the password
    ("unix:///run/r.sock?db=1&password=pw", "unix:///run/r.sock?db=1&password=***"),
    ("rediss://cache:6380", "rediss://cache:6380"),
])
def test_redacted_urls_keep_everything_but_the_secret(url: str, shown: str) -> None:
    from sqlqueue.naming import redacted_url

    assert redacted_url(url) == shown


def test_a_refused_redis_url_is_shown_without_its_password() -> None:
    _, problems = validate({"WAKEUP_REDIS_URL": "http://:Sup3rRedisPW@cache:6379"}, ALIASES)
    assert [p.id for p in problems] == ["sqlqueue.E008"]
    assert "Sup3rRedisPW" not in problems[0].msg and "http://***@cache:6379" in problems[0].msg


# -- settings ------------------------------------------------------------------------------
def _ids(raw: dict[str, Any]) -> list[str]:
    return [p.id for p in validate(raw, ALIASES)[1]]


def test_wakeup_settings_defaults() -> None:
    conf, problems = validate({}, ALIASES)
    assert problems == [] and conf is not None
    assert conf.WAKEUPS is True
    assert conf.WAKEUP_REDIS_URL == ""
    assert conf.listen_alias_for("default") == "default"


def test_wakeup_listen_databases_names_the_listener_alias() -> None:
    conf, _ = validate({"WAKEUP_LISTEN_DATABASES": {"default": "session"}}, ALIASES)
    assert conf is not None and conf.listen_alias_for("default") == "session"


@pytest.mark.parametrize(("raw", "check_id"), [
    ({"WAKEUPS": "yes"}, "sqlqueue.E003"),
    ({"WAKEUP_REDIS_URL": "http://127.0.0.1:6379"}, "sqlqueue.E008"),
    ({"WAKEUP_REDIS_URL": 6379}, "sqlqueue.E003"),
    ({"WAKEUP_LISTEN_DATABASES": ["default"]}, "sqlqueue.E003"),
    ({"WAKEUP_LISTEN_DATABASES": {"default": ""}}, "sqlqueue.E004"),
    ({"WAKEUP_LISTEN_DATABASES": {"default": "nowhere"}}, "sqlqueue.E007"),
    ({"WAKEUP_LISTEN_DATABASES": {"default": "lite"}}, "sqlqueue.E009"),
])
def test_bad_wakeup_settings_are_refused(raw: dict[str, Any], check_id: str) -> None:
    assert _ids(raw) == [check_id]


def test_redis_urls_are_accepted() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://cache:6380", "unix:///run/redis.sock"):
        assert _ids({"WAKEUP_REDIS_URL": url}) == []


def test_a_redis_url_without_the_redis_package_is_a_warning(settings: Any,
                                                            monkeypatch: Any) -> None:
    import importlib.util

    from sqlqueue.checks import check_wakeup_channels

    settings.SQLQUEUE = {"WAKEUP_REDIS_URL": "redis://127.0.0.1:6379/0"}
    assert check_wakeup_channels() == []  # installed here (the dev extra)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "redis" else real(name, *a))
    assert [m.id for m in check_wakeup_channels()] == ["sqlqueue.W004"]
    settings.SQLQUEUE = {}
    assert check_wakeup_channels() == []


# -- their clock: given, and stepped here (issue 54) ----------------------------------------
class Idle(Listener):
    """Subscribed at once; hears what the test says."""

    heartbeats = True

    def listen(self) -> None:  # never started here
        raise AssertionError("not started")


def test_a_silent_channel_is_timed_on_the_listener_s_clock() -> None:
    from sqlqueue.wakeups.listener import ECHO_WAIT, HEARTBEAT_AFTER, SilentChannel
    from tests.manual_clock import ManualSeconds

    clock = ManualSeconds(100.0)
    listener = Idle(["t"], lambda topic: None, host_clock=clock)
    listener.listening()
    assert not listener.wants_heartbeat()
    clock.sleep(HEARTBEAT_AFTER)
    assert listener.wants_heartbeat()
    listener.heartbeat_sent()
    clock.sleep(ECHO_WAIT - 0.5)
    listener.check_echo()  # not yet: still within ECHO_WAIT
    clock.sleep(0.5)
    with pytest.raises(SilentChannel, match="heard nothing for 10s"):
        listener.check_echo()
    listener.heard("t")  # the echo after all
    listener.check_echo()


def test_a_redis_publisher_s_quiet_spell_is_timed_on_its_clock() -> None:
    from sqlqueue.wakeups.redis_channel import QUIET_AFTER_FAILURE
    from tests.manual_clock import ManualSeconds

    clock = ManualSeconds(0.0)
    publisher = Publisher("redis://127.0.0.1:6390/0", host_clock=clock)
    fake = _FakeRedis()
    publisher._client = fake  # as _connected() made it
    assert publisher.publish(["t"]) is False
    fake.down = False
    assert publisher.publish(["t"]) is False  # quiet: not even tried
    clock.sleep(QUIET_AFTER_FAILURE[0])
    assert publisher.publish(["t"]) is True
