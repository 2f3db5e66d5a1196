"""Idempotent publish with real concurrent connections (one per thread)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

from sqlqueue import SentMessage, send_message, send_messages
from tests.conftest import stored_messages

pytestmark = pytest.mark.django_db(transaction=True)
T = TypeVar("T")
TIMEOUT = 30


def in_thread(fn: Callable[[], T]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` on its own thread, hence its own database connection."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = fn()
        except BaseException as exc:  # reported to the test, not swallowed
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def result(thread: threading.Thread, outcome: dict[str, Any]) -> Any:
    thread.join(TIMEOUT)
    assert not thread.is_alive(), "the second connection never finished"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _wait_for_postgresql_lock_wait() -> None:
    import time

    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            # Inside a transaction pg_stat_activity is read once and kept: drop that copy.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = "
                           "'Lock' AND datname = current_database()")
            if cursor.fetchone()[0]:
                return
        time.sleep(0.02)  # polling a condition; pg_stat_activity is current
    raise AssertionError("no transaction ever waited for a lock")


def wait_for_lock_wait() -> None:
    """On MariaDB/MySQL, wait until some transaction is blocked on a row lock."""
    if connection.vendor == "postgresql":
        _wait_for_postgresql_lock_wait()
        return
    if connection.vendor != "mysql":
        return  # SQLite: the second writer waits on the file lock; not observable
    import time

    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'"
            )
            if cursor.fetchone()[0]:
                return
        # Polling a condition. InnoDB refreshes its INNODB_TRX snapshot only when the
        # last one is 0.1 s old, so faster polling would keep reading a stale one.
        time.sleep(0.15)
    raise AssertionError("the second publisher never blocked on the first one's row")


def test_second_publisher_waits_for_the_first_and_reports_its_offset() -> None:
    with transaction.atomic():
        first = send_message("t", {"from": "first"}, partition_key="k", id="same")
        thread, outcome = in_thread(
            lambda: send_message("t", {"from": "second"}, partition_key="k", id="same")
        )
        wait_for_lock_wait()
    second: SentMessage = result(thread, outcome)
    assert first.created is True
    assert (second.created, second.offset) == (False, first.offset)
    assert [m["payload"] for m in stored_messages()] == [{"from": "first"}]


def test_second_publisher_wins_when_the_first_rolls_back() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        send_message("t", {"from": "first"}, partition_key="k", id="same")
        thread, outcome = in_thread(
            lambda: send_message("t", {"from": "second"}, partition_key="k", id="same")
        )
        wait_for_lock_wait()
        raise RuntimeError("the first publisher's transaction fails")
    second: SentMessage = result(thread, outcome)
    assert second.created is True
    assert [m["payload"] for m in stored_messages()] == [{"from": "second"}]


def test_racing_publishers_store_each_id_once() -> None:
    rounds, racers = 20, 4
    barrier = threading.Barrier(racers)

    def race() -> list[SentMessage]:
        sent = []
        for n in range(rounds):
            barrier.wait(TIMEOUT)
            with transaction.atomic():
                sent.append(send_message("t", n, partition_key="k", id=f"id-{n}"))
        return sent

    threads = [in_thread(race) for _ in range(racers)]
    outcomes = [result(*t) for t in threads]
    for n in range(rounds):
        sent = [per_racer[n] for per_racer in outcomes]
        assert sum(s.created for s in sent) == 1, f"id-{n} created {sent}"
        assert len({s.offset for s in sent}) == 1
    assert len(stored_messages()) == rounds


@pytest.mark.parametrize("window", [86400, 0])
def test_racing_batches_store_each_id_once(window: int) -> None:
    """With the idempotency window, the keys' locks order the racers; without it, their
    INSERTs (PostgreSQL: COPYs) meet on the unique key, and the losers read the
    winners' offsets."""
    racers = 3
    barrier = threading.Barrier(racers)
    ids = [f"id-{n}" for n in range(300)]

    def race() -> list[SentMessage]:
        from sqlqueue import OutgoingMessage

        barrier.wait(TIMEOUT)
        return send_messages("t", [OutgoingMessage(i, partition_key="k", id=i) for i in ids])

    # Overridden here, once, for the racers to read: override_settings entered and left
    # in each thread restores in any order, and could leave the override in place.
    with override_settings(SQLQUEUE={"IDEMPOTENCY_WINDOW": window}):
        outcomes = [result(*t) for t in [in_thread(race) for _ in range(racers)]]
    for n in range(len(ids)):
        sent = [per_racer[n] for per_racer in outcomes]
        assert sum(s.created for s in sent) == 1
        assert len({s.offset for s in sent}) == 1
    assert len(stored_messages()) == len(ids)
