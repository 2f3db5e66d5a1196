"""Wake-ups on a real database: a commit wakes a runner sleeping a 30 s poll interval
at once; a rollback wakes nothing; PostgreSQL's NOTIFY goes once per topic per
transaction and its listener survives a terminated session; Redis carries wake-ups
between processes, and Redis down breaks nothing."""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext, override_settings

from sqlqueue import OutgoingMessage, send_message, send_messages, wakeups
from sqlqueue.conf import QueueSettings
from sqlqueue.consuming.registry import select_consumers
from sqlqueue.consuming.runner import Runner
from sqlqueue.wakeups.postgresql import PostgreSQLListener, connection_params
from sqlqueue.wakeups.redis_channel import CHANNEL_PREFIX, RedisListener
from tests.integration.consuming_helpers import register

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["register"]  # a fixture

REDIS_URL = "redis://127.0.0.1:6379/0"
#: an hour: no wait below comes near it, so only a wake-up explains a start (the waits'
#: own bounds, HANDLED, only end a hang)
SLOW_POLL = 3600.0
HANDLED = 60.0


def until(condition: Callable[[], object], timeout: float = 20, what: str = "") -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(0.005)
    return time.monotonic() - started


def postgresql_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's NOTIFY/LISTEN")


def redis_available() -> None:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except redis.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379")


@pytest.fixture
def rung() -> Iterator[list[str]]:
    """The topics this process's registry rings, in order."""
    heard: list[str] = []
    unsubscribe = wakeups.subscribe(["wk.a", "wk.b"], heard.append)
    yield heard
    unsubscribe()


class SleepyRunner:
    """A runner on a thread whose only poll is every SLOW_POLL seconds (adaptive polling
    and lease ticks out of the way)."""

    def __init__(self, topic: str, group: str, **overrides: Any) -> None:
        values: dict[str, Any] = {"POLL_INTERVAL": SLOW_POLL, "LEASE_DURATION": 3 * SLOW_POLL,
                                  "LEASE_RENEW_INTERVAL": SLOW_POLL, "SHUTDOWN_TIMEOUT": 5,
                                  **overrides}
        conf = dataclasses.replace(QueueSettings(), **values)
        self.runner = Runner(select_consumers([group], [topic]), conf=conf, threads=1)
        self.runner.pacer.polling_delay = lambda head: SLOW_POLL  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.runner.run(install_signal_handlers=False)
        finally:
            connections.close_all()

    def asleep(self, handled: int) -> bool:
        """Has it recorded ``handled`` outcomes, and is it waiting, subscribed everywhere?"""
        runner = self.runner
        return (sum(runner.stats.values()) >= handled and runner.wakeup.waiting
                and runner.wakeups is not None
                and all(listener.connected.is_set() for listener in runner.wakeups.listeners))

    def settled(self) -> bool:
        """Asleep with nothing handled, subscribed everywhere, and each channel's ring on
        subscribing (``Listener.listening``) already spent on a pass."""
        wakeups = self.runner.wakeups
        return (self.asleep(0) and not self.runner.wakeup.is_set()
                and (wakeups is None or not wakeups.listeners
                     or self.runner.wakeup.wakeups >= 1))

    def __enter__(self) -> SleepyRunner:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.runner.stop()
        self.thread.join(30)


def _recorder(register: Any, topic: str, group: str) -> queue.SimpleQueue[int]:
    handled: queue.SimpleQueue[int] = queue.SimpleQueue()
    register(topic, group, lambda message: handled.put(message.payload["n"]))
    return handled


def _handled(handled: queue.SimpleQueue[int], n: int, why: str) -> None:
    """Message ``n`` is the next one handled; ``why`` says what must have started it."""
    try:
        assert handled.get(timeout=HANDLED) == n
    except queue.Empty:
        raise AssertionError(f"message {n} was never handled: {why}") from None


# -- a committed publish wakes a sleeping runner ----------------------------------------------
def test_a_commit_wakes_a_runner_sleeping_its_poll_interval(register: Any) -> None:
    handled = _recorder(register, "wk.a", "sleepers")
    send_message("wk.a", {"n": 0}, partition_key="p")  # its first pass finds this one
    with SleepyRunner("wk.a", "sleepers") as sleepy:
        assert handled.get(timeout=20) == 0
        until(lambda: sleepy.asleep(1), what="the runner to sleep")
        with transaction.atomic():
            send_message("wk.a", {"n": 1}, partition_key="p")
        _handled(handled, 1, "the commit did not wake the runner from its hour-long poll")
        assert sleepy.runner.wakeup.wakeups >= 1


def test_without_wakeups_the_runner_sleeps_on(register: Any) -> None:
    handled = _recorder(register, "wk.a", "sleepers")
    send_message("wk.a", {"n": 0}, partition_key="p")
    with (override_settings(SQLQUEUE={"WAKEUPS": False}),
          SleepyRunner("wk.a", "sleepers", WAKEUPS=False) as sleepy):
        assert handled.get(timeout=20) == 0
        until(lambda: sleepy.asleep(1), what="the runner to sleep")
        assert sleepy.runner.wakeups is not None and sleepy.runner.wakeups.listeners == []
        with CaptureQueriesContext(connection) as captured:
            send_message("wk.a", {"n": 1}, partition_key="p")
        # Nothing listens in this process, no pg_notify went out, and the runner never
        # woke early: it sleeps on, for SLOW_POLL (no wait needed to see it).
        assert wakeups.ring(["wk.a"]) == 0
        assert _notifies(captured) == []
        assert sleepy.runner.wakeup.wakeups == 0 and handled.empty()


# -- new partitions ------------------------------------------------------------------------
def test_a_new_partition_woken_for_too_soon_after_the_last_look_is_looked_for_again_soon(
    register: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wake-up that comes less than MIN_DISCOVERY_INTERVAL after the last look for new
    partitions finds none; the runner looks again once allowed, not at its next poll."""
    from sqlqueue.consuming import discovery

    monkeypatch.setattr(discovery, "MIN_DISCOVERY_INTERVAL", 1.0)
    handled = _recorder(register, "wk.a", "explorers")
    with SleepyRunner("wk.a", "explorers") as sleepy:
        until(sleepy.settled, what="the runner to settle")
        send_message("wk.a", {"n": 0}, partition_key="p")
        assert handled.get(timeout=20) == 0  # p found: the next look waits 1 s
        send_message("wk.a", {"n": 1}, partition_key="q")
        _handled(handled, 1, "q was not looked for again once allowed (1 s), only at the "
                 "next poll (an hour)")


# -- rings follow the commit --------------------------------------------------------------
def test_a_rollback_rings_nothing_and_a_commit_rings_each_topic_once(rung: list[str]) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        send_message("wk.a", {"n": 1})
        raise RuntimeError("rolled back")
    assert rung == []
    with transaction.atomic():
        send_message("wk.a", {"n": 2})
        send_message("wk.a", {"n": 3})
        send_messages("wk.b", [OutgoingMessage({"n": 4}), {"n": 5}])
        assert rung == []  # nothing before the commit
    assert sorted(rung) == ["wk.a", "wk.b"]


def test_autocommit_publishes_ring_at_once(rung: list[str]) -> None:
    send_message("wk.a", {"n": 1})
    send_messages("wk.b", [{"n": 2}])
    assert rung == ["wk.a", "wk.b"]


def test_a_savepoint_rolled_back_takes_its_ring_with_it(rung: list[str]) -> None:
    with transaction.atomic():
        send_message("wk.a", {"n": 1})
        with pytest.raises(RuntimeError), transaction.atomic():
            send_message("wk.b", {"n": 2})
            raise RuntimeError("savepoint rolled back")
    assert rung == ["wk.a"]


def test_a_publish_nobody_would_hear_adds_no_commit_hook(rung: list[str]) -> None:
    """A topic no runner of this process consumes, without Redis: nothing to ring at
    commit. On PostgreSQL the INSERT carried the NOTIFY, which the next INSERT carries
    again: nothing to remember either."""
    with transaction.atomic():
        send_message("wk.unheard", {"n": 1})
        send_message("wk.unheard", {"n": 2})
        unheard_hooks = len(connection.run_on_commit)
        send_message("wk.a", {"n": 3})
        hooks = len(connection.run_on_commit)
    assert (unheard_hooks, hooks) == (0, 1)
    assert rung == ["wk.a"]


def test_a_dedup_hit_rings_nothing(rung: list[str]) -> None:
    send_message("wk.a", {"n": 1}, id="same")
    rung.clear()
    assert send_message("wk.a", {"n": 1}, id="same").created is False
    assert rung == []


# -- PostgreSQL NOTIFY ---------------------------------------------------------------------
def _notifies(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if "pg_notify" in q["sql"]]


def _carries_notify(sql: str) -> bool:
    """A publishing INSERT carrying its wake-up (plain, or the prepared variant)."""
    return not sql.startswith(("SELECT pg_notify", "PREPARE")) and (
        "pg_notify" in sql or '_wake"' in sql)


def test_notify_rides_in_each_insert_and_goes_once_per_topic_as_a_statement() -> None:
    """``send_message``'s INSERT carries the NOTIFY every time (free; the server delivers
    repeats within a transaction once). A NOTIFY that costs a statement of its own, after
    ``send_messages``' multi-row INSERT, is remembered: once per topic per transaction."""
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        for n in range(3):
            send_message("wk.a", {"n": n})
        send_messages("wk.a", [{"n": 3}, {"n": 4}])
        send_messages("wk.b", [{"n": 5}])
        send_message("wk.b", {"n": 6})
        send_messages("wk.b", [{"n": 7}])
    statements = [q["sql"] for q in captured.captured_queries]
    postgresql = connection.vendor == "postgresql"
    own_statements = [sql for sql in statements if sql.startswith("SELECT pg_notify")]
    assert len(own_statements) == (2 if postgresql else 0)
    assert sum(map(_carries_notify, statements)) == (3 if postgresql else 0)


def test_notify_is_sent_again_after_its_savepoint_rolled_back() -> None:
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            send_message("wk.b", {"n": 1})
            raise RuntimeError("savepoint rolled back, its NOTIFY too")
        send_message("wk.b", {"n": 2})
    assert len(_notifies(captured)) == (2 if connection.vendor == "postgresql" else 0)


@pytest.fixture
def listener() -> Iterator[tuple[PostgreSQLListener, queue.SimpleQueue[str]]]:
    postgresql_only()
    heard: queue.SimpleQueue[str] = queue.SimpleQueue()
    started = PostgreSQLListener(connection_params("default"), ["wk.a", "wk.b"], heard.put)
    started.start()
    until(started.connected.is_set, what="the listener")
    while not heard.empty():
        heard.get()  # the catch-up rings of its connection
    yield started, heard
    started.stop()


def test_postgresql_listener_hears_commits_not_rollbacks(
        listener: tuple[PostgreSQLListener, queue.SimpleQueue[str]]) -> None:
    _, heard = listener
    with pytest.raises(RuntimeError), transaction.atomic():
        send_message("wk.a", {"n": 1})
        raise RuntimeError("rolled back")
    with transaction.atomic():
        send_message("wk.b", {"n": 2})
        send_message("wk.b", {"n": 3})
    # Notifications arrive in commit order: had the rollback sent one, it came first.
    assert heard.get(timeout=10) == "wk.b"
    send_message("wk.a", {"n": 4})
    assert heard.get(timeout=10) == "wk.a"


def test_postgresql_a_dedup_hit_notifies_nothing(
        listener: tuple[PostgreSQLListener, queue.SimpleQueue[str]]) -> None:
    """One message's pg_notify rides in its INSERT, run only for a row stored: a second
    publish of a stored id (in a transaction: ON CONFLICT skips it) wakes nobody."""
    _, heard = listener
    with override_settings(SQLQUEUE={"IDEMPOTENCY_WINDOW": 0}):
        send_message("wk.a", {"n": 1}, partition_key="k", id="once")
        assert heard.get(timeout=10) == "wk.a"
        with transaction.atomic():
            assert send_message("wk.a", {"n": 1}, partition_key="k", id="once").created \
                is False
        send_message("wk.b", {"n": 2})
    # In commit order: had the dedup hit notified, wk.a came first.
    assert heard.get(timeout=10) == "wk.b"


def test_postgresql_listener_survives_its_session_being_terminated(
        listener: tuple[PostgreSQLListener, queue.SimpleQueue[str]]) -> None:
    started, heard = listener
    pid = started.backend_pid
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    until(lambda: started.connections == 2 and started.connected.is_set(),
          what="the listener to reconnect")
    assert started.backend_pid != pid
    assert {heard.get(timeout=10), heard.get(timeout=10)} == {"wk.a", "wk.b"}  # catch-up
    send_message("wk.a", {"n": 1})
    assert heard.get(timeout=10) == "wk.a"


def test_postgresql_listener_behind_a_pooler_listens_straight_to_the_server_behind(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Its connection reaches the server through a pooler (pg_backend_pid() differs: the
    first connection here) and no listener alias is set: it connects to the address the
    server answered on, checks that it is the same server and a session of its own, and
    listens there (issue 39: latency as direct behind PgBouncer with default settings)."""
    postgresql_only()
    from sqlqueue.storage.sql import postgresql as store_module

    pooled = [True]  # the first connection goes through the "pooler"

    def reaches_directly(cursor: Any, pid: int) -> bool:
        if pooled:
            return not pooled.pop()
        return store_module.reaches_server_directly(cursor, pid)

    monkeypatch.setattr("sqlqueue.wakeups.postgresql.reaches_server_directly",
                        reaches_directly)
    heard: queue.SimpleQueue[str] = queue.SimpleQueue()
    past = PostgreSQLListener(connection_params("default"), ["wk.a"], heard.put,
                              alias="default")
    with caplog.at_level("INFO", logger="sqlqueue.wakeups"):
        past.start()
        try:
            until(past.connected.is_set, what="the listener past the pooler")
            with connection.cursor() as cursor:
                cursor.execute("SELECT application_name FROM pg_stat_activity "
                               "WHERE pid = %s", [past.backend_pid])
                assert cursor.fetchone()[0] == "sqlqueue wake-ups"
            send_message("wk.a", {"n": 1})
            assert "wk.a" in {heard.get(timeout=10), heard.get(timeout=10)}
        finally:
            past.stop()
    (said,) = [r.getMessage() for r in caplog.records]
    assert "straight to that server, at " in said and "'default'" in said


def test_postgresql_listener_behind_a_pooler_stays_off_with_one_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Its connection reaches the server through a pooler (pg_backend_pid() differs), no
    listener alias is set and the server behind cannot be reached directly (here: the
    address it answered on refuses connections): no LISTEN, never connected, one
    warning, the thread ends (so the runner keeps its quick polls)."""
    postgresql_only()
    from tests.acceptance.servers import free_port

    monkeypatch.setattr("sqlqueue.wakeups.postgresql.reaches_server_directly",
                        lambda cursor, pid: False)
    monkeypatch.setattr("sqlqueue.wakeups.postgresql.server_address",
                        lambda identity: ("127.0.0.1", free_port()))
    heard: queue.SimpleQueue[str] = queue.SimpleQueue()
    deaf = PostgreSQLListener(connection_params("default"), ["wk.a"], heard.put,
                              alias="default")
    with caplog.at_level("WARNING", logger="sqlqueue.wakeups"):
        deaf.start()
        deaf.join(timeout=10)
    assert not deaf.is_alive() and not deaf.connected.is_set() and deaf.connections == 0
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "'default'" in warning and "WAKEUP_LISTEN_DATABASES" in warning
    assert "connecting straight to it at 127.0.0.1:" in warning
    assert heard.empty()


def test_postgresql_listener_trusts_a_pooler_behind_a_listener_alias(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener alias the settings name may be a session-mode pool: LISTEN there."""
    postgresql_only()
    monkeypatch.setattr("sqlqueue.wakeups.postgresql.reaches_server_directly",
                        lambda cursor, pid: False)
    heard: queue.SimpleQueue[str] = queue.SimpleQueue()
    trusted = PostgreSQLListener(connection_params("default"), ["wk.a"], heard.put,
                                 alias="default", listener_alias=True)
    trusted.start()
    try:
        until(trusted.connected.is_set, what="the listener")
        with connection.cursor() as cursor:
            cursor.execute("SELECT application_name FROM pg_stat_activity WHERE pid = %s",
                           [trusted.backend_pid])
            assert cursor.fetchone()[0] == "sqlqueue wake-ups"  # its own session
        send_message("wk.a", {"n": 1})
        assert "wk.a" in {heard.get(timeout=10), heard.get(timeout=10)}  # catch-up, then it
    finally:
        trusted.stop()


def test_a_runner_on_postgresql_listens_through_the_listener_alias(register: Any) -> None:
    postgresql_only()
    _recorder(register, "wk.a", "sleepers")
    with SleepyRunner("wk.a", "sleepers",
                      WAKEUP_LISTEN_DATABASES=(("default", "routes"),)) as sleepy:
        until(lambda: sleepy.asleep(0), what="the runner to sleep")
        (listening,) = sleepy.runner.wakeups.listeners  # type: ignore[union-attr]
        assert isinstance(listening, PostgreSQLListener)
        assert listening.params["dbname"] == connections["routes"].settings_dict["NAME"]


# -- Redis -----------------------------------------------------------------------------------
def test_redis_carries_committed_topics_only() -> None:
    redis_available()
    heard: queue.SimpleQueue[str] = queue.SimpleQueue()
    listening = RedisListener(REDIS_URL, ["wk.a", "wk.b"], heard.put)
    listening.start()
    try:
        until(listening.connected.is_set, what="the Redis listener")
        while not heard.empty():
            heard.get()
        with override_settings(SQLQUEUE={"WAKEUP_REDIS_URL": REDIS_URL}):
            with pytest.raises(RuntimeError), transaction.atomic():
                send_message("wk.a", {"n": 1})
                raise RuntimeError("rolled back")
            with transaction.atomic():
                send_message("wk.b", {"n": 2})
                send_message("wk.b", {"n": 3})
            assert heard.get(timeout=10) == "wk.b"
            send_message("wk.a", {"n": 4})
            assert heard.get(timeout=10) == "wk.a"
    finally:
        listening.stop()
    assert CHANNEL_PREFIX == "sqlqueue:"


def test_redis_down_breaks_neither_publishing_nor_consuming(register: Any,
                                                             rung: list[str]) -> None:
    down = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    handled = _recorder(register, "wk.a", "sleepers")
    with override_settings(SQLQUEUE={"WAKEUP_REDIS_URL": down}):
        with transaction.atomic():
            sent = send_message("wk.a", {"n": 0}, partition_key="p")
        assert sent.created and rung == ["wk.a"]  # committed; this process still rung
        with SleepyRunner("wk.a", "sleepers", WAKEUP_REDIS_URL=down) as sleepy:
            assert handled.get(timeout=20) == 0
            listeners = sleepy.runner.wakeups.listeners  # type: ignore[union-attr]
            (redis_listener,) = [x for x in listeners if isinstance(x, RedisListener)]
            assert redis_listener.is_alive() and not redis_listener.connected.is_set()


class MutingForwarder:
    """127.0.0.1:<port> relayed to PostgreSQL. ``mute()``: the connections open now stay
    open but what the server sends them is dropped (seen from the client: a session
    connected and deaf, as behind a frozen server process or a stuck proxy)."""

    def __init__(self, host: str, port: int) -> None:
        import socket

        self.backend = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.muted: list[threading.Event] = []
        self.sockets: list[Any] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.backend)
            muted = threading.Event()
            self.muted.append(muted)
            self.sockets += [client, server]
            for source, target, mute in ((client, server, None), (server, client, muted)):
                threading.Thread(target=self._pipe, args=(source, target, mute),
                                 daemon=True).start()

    @staticmethod
    def _pipe(source: Any, target: Any, muted: threading.Event | None) -> None:
        try:
            while data := source.recv(65536):
                if muted is None or not muted.is_set():
                    target.sendall(data)
        except OSError:
            pass

    def mute(self) -> None:
        for muted in self.muted:
            muted.set()

    def close(self) -> None:
        self.listener.close()
        for end in self.sockets:
            end.close()


def test_postgresql_listener_on_a_deaf_session_says_so_once_and_listens_again(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 51: a listening session that stays connected but hears nothing (the wave-4
    rerun froze its server process: latency went to the poll interval, nothing logged).
    Once it heard nothing for HEARTBEAT_AFTER the runner sends a heartbeat; when not
    even that is heard within ECHO_WAIT the listener says so once, stops counting as a
    channel (quick polls again), and listens on a new session, which hears."""
    postgresql_only()
    from sqlqueue import storage
    from sqlqueue.consuming.wakeups import Wakeups
    from sqlqueue.wakeups import listener as listener_module

    monkeypatch.setattr(listener_module, "HEARTBEAT_AFTER", 0.3)
    monkeypatch.setattr(listener_module, "ECHO_WAIT", 0.5)
    params = connection_params("default")
    forwarder = MutingForwarder(params.get("host") or "127.0.0.1", int(params.get("port")
                                                                        or 5432))
    params = {**{k: v for k, v in params.items() if k not in ("hostaddr", "service")},
              "host": "127.0.0.1", "port": forwarder.port}
    heard: queue.SimpleQueue[str] = queue.SimpleQueue()
    started = PostgreSQLListener(params, ["wk.a"], heard.put, listener_alias=True)
    channels = Wakeups(dataclasses.replace(QueueSettings(), WAKEUPS=False), "default",
                       ["wk.a"], heard.put)
    channels.listeners = [started]

    def runner_pass() -> None:  # what the runner's loop does for its listeners
        with connection.cursor() as cursor:
            channels.keep_alive(lambda: storage.store(connection).notify_heartbeat(cursor))

    started.start()
    try:
        until(started.connected.is_set, what="the listener")
        quiet = time.monotonic()
        until(lambda: runner_pass() or time.monotonic() - quiet > 1.5, what="heartbeats")
        assert started.silences == 0 and started.deaf is None  # its heartbeats are heard
        assert started.heartbeat_sent_at > quiet and channels.cover_other_processes()
        caplog.set_level("INFO", "sqlqueue.wakeups")
        forwarder.mute()
        until(lambda: runner_pass() or started.silences, what="the deaf session noticed")
        assert started.deaf is not None and "connected but deaf" in started.deaf
        assert channels.deaf() == [started.deaf]
        assert not channels.cover_other_processes()  # quick polls cover the gap
        until(lambda: runner_pass() or (started.connections == 2 and started.deaf is None),
              what="a new session that hears")
        assert channels.cover_other_processes() and channels.deaf() == []
        send_message("wk.a", {"n": 1})
        until(lambda: not heard.empty() and heard.get() == "wk.a", what="a wake-up")
    finally:
        started.stop()
        started.join(10)  # its session closed before the test database goes
        forwarder.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "connected but deaf" in warnings[0]
    assert any("hears again" in r.getMessage() for r in caplog.records)
