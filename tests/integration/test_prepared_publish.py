"""The one-message INSERT prepared in a PostgreSQL session (sqlqueue.storage.sql.prepared):
when a connection prepares it, that what it stores is what the plain INSERT stores, and
that a pooler, the setting, server-side binding and a lost statement are all handled."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from sqlqueue import send_message
from sqlqueue.storage.sql.prepared import PREPARE_AFTER, session_statements
from sqlqueue.storage.statements.publishing import WAKEUP_CHANNEL
from tests.conftest import stored_messages

pytestmark = pytest.mark.django_db(transaction=True)
STATEMENTS = ("INSERT", "SELECT", "PREPARE", "EXECUTE", "DEALLOCATE")


@pytest.fixture(autouse=True)
def fresh_session() -> Iterator[None]:
    """A server session of its own: nothing prepared, nothing counted."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL prepares statements in a session")
    connection.close()
    yield
    connection.close()


@pytest.fixture
def client_side_binding() -> None:
    """Django's default binding, where sqlqueue prepares (with server-side binding
    psycopg prepares by its own ``prepare_threshold``)."""
    if connection.settings_dict["OPTIONS"].get("server_side_binding"):
        pytest.skip("sqlqueue prepares with client-side binding only")


def sent_statements(captured: CaptureQueriesContext) -> list[str]:
    """The first word of each statement sent (BEGIN and COMMIT left out)."""
    words = [query["sql"].split(" ", 1)[0] for query in captured.captured_queries]
    return [word for word in words if word in STATEMENTS]


def publish(count: int, *, atomic: bool = True, **options: Any) -> list[int]:
    """``count`` messages of topic ``orders``, one transaction each; their offsets."""
    offsets = []
    for n in range(count):
        with transaction.atomic() if atomic else nullcontext():
            offsets.append(send_message("orders", {"n": n}, **options).offset)
    return offsets


@pytest.mark.usefixtures("client_side_binding")
def test_a_connection_that_publishes_often_prepares_the_insert_once() -> None:
    with CaptureQueriesContext(connection) as captured:
        offsets = publish(PREPARE_AFTER + 3, partition_key="k")
    assert sent_statements(captured) == (
        ["INSERT"] * (PREPARE_AFTER - 1) + ["SELECT", "PREPARE"] + ["EXECUTE"] * 4)
    stored = stored_messages("orders")
    assert [row["offset"] for row in stored] == offsets
    assert [row["payload"] for row in stored] == [{"n": n} for n in range(PREPARE_AFTER + 3)]
    # Outside a transaction: the same variant (the ids are sqlqueue's: no ON CONFLICT).
    with CaptureQueriesContext(connection) as captured:
        publish(2, atomic=False, partition_key="k")
    assert sent_statements(captured) == ["EXECUTE", "EXECUTE"]
    # Ids of the caller's in a transaction: the variant with ON CONFLICT, counted on its
    # own (no idempotency window: its key statements would come between).
    with (override_settings(SQLQUEUE={"IDEMPOTENCY_WINDOW": 0}),
          CaptureQueriesContext(connection) as captured):
        for n in range(PREPARE_AFTER + 1):
            with transaction.atomic():
                send_message("orders", {"n": n}, partition_key="k", id=f"caller-{n}")
    assert sent_statements(captured) == (
        ["INSERT"] * (PREPARE_AFTER - 1) + ["PREPARE", "EXECUTE", "EXECUTE"])
    prepared = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("PREPARE")]
    assert "ON CONFLICT" in prepared[0]
    assert len(stored_messages("orders")) == 2 * PREPARE_AFTER + 6


@pytest.mark.usefixtures("client_side_binding")
def test_the_prepared_insert_stores_every_column_as_the_plain_one_does() -> None:
    options: dict[str, Any] = {"partition_key": "k", "metadata": {"trace": "t-1"},
                               "priority": 7}
    plain = publish(1, **options)
    prepared = publish(PREPARE_AFTER + 1, **options)[-1]
    assert session_statements(connection.connection).prepared
    rows = {row["offset"]: row for row in stored_messages("orders")}
    varying = ("offset", "id", "created_at", "published_at", "payload")
    same = [{k: v for k, v in rows[offset].items() if k not in varying}
            for offset in (plain[0], prepared)]
    assert same[0] == same[1]
    assert rows[prepared]["created_at"] >= rows[plain[0]]["created_at"] > 0


@pytest.mark.usefixtures("client_side_binding")
def test_a_duplicate_id_comes_back_with_the_stored_offset_through_the_prepared_insert(
) -> None:
    with override_settings(SQLQUEUE={"IDEMPOTENCY_WINDOW": 0}):  # the INSERT finds it
        first = send_message("orders", {"n": 0}, partition_key="k", id="same")
        for atomic in (False, True, False, True, False, True, False, True):
            with transaction.atomic() if atomic else nullcontext():
                again = send_message("orders", {"n": 1}, partition_key="k", id="same")
            assert (again.offset, again.created) == (first.offset, False)
    assert session_statements(connection.connection).prepared
    assert [row["payload"] for row in stored_messages("orders")] == [{"n": 0}]


@pytest.mark.usefixtures("client_side_binding")
def test_the_prepared_insert_wakes_the_listeners_at_commit() -> None:
    listener = psycopg.connect(**connection.get_connection_params(), autocommit=True)
    try:
        listener.execute(f'LISTEN "{WAKEUP_CHANNEL}"')
        publish(PREPARE_AFTER + 2, partition_key="k")
        with transaction.atomic():  # rolled back: no wake-up
            send_message("orders", {"n": -1}, partition_key="k")
            transaction.set_rollback(True)
        assert session_statements(connection.connection).prepared
        heard = [n.payload for n in listener.notifies(timeout=2)]
    finally:
        listener.close()
    assert heard == ["orders"] * (PREPARE_AFTER + 2)


@pytest.mark.usefixtures("client_side_binding")
def test_a_connection_through_a_pooler_prepares_nothing(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """A pooler answers the startup with a cancel key of its own: the pid it reports is
    not the server session's."""
    monkeypatch.setattr(psycopg.ConnectionInfo, "backend_pid", property(lambda info: 1))
    with CaptureQueriesContext(connection) as captured:
        publish(PREPARE_AFTER + 5, partition_key="k")
    assert sent_statements(captured) == (
        ["INSERT"] * (PREPARE_AFTER - 1) + ["SELECT"] + ["INSERT"] * 6)
    assert session_statements(connection.connection).direct is False
    assert len(stored_messages("orders")) == PREPARE_AFTER + 5


@pytest.mark.parametrize("why", ["setting", "server_side_binding"])
def test_nothing_is_prepared_when_turned_off_or_bound_on_the_server(
    why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``PREPARED_PUBLISH = False``; server-side binding leaves preparing to psycopg's
    ``prepare_threshold`` (and a bound EXECUTE has no parameters to take)."""
    settings = {"PREPARED_PUBLISH": False} if why == "setting" else {}
    if why == "server_side_binding":
        monkeypatch.setitem(connection.settings_dict, "OPTIONS",
                            {**connection.settings_dict["OPTIONS"],
                             "server_side_binding": True})
    with override_settings(SQLQUEUE=settings), CaptureQueriesContext(connection) as captured:
        publish(PREPARE_AFTER + 3, partition_key="k")
    assert set(sent_statements(captured)) == {"INSERT"}


@pytest.mark.usefixtures("client_side_binding")
def test_a_session_that_lost_its_statements_keeps_publishing_and_prepares_again() -> None:
    """``DEALLOCATE ALL`` (or ``DISCARD ALL``) by the application: inside a transaction
    the transaction is lost, as after any error; outside one the message is stored by
    the plain INSERT at once; the session prepares again after as many runs."""
    def lose_them() -> None:
        with connection.cursor() as cursor:
            cursor.execute("DEALLOCATE ALL")

    publish(PREPARE_AFTER, partition_key="k")
    lose_them()
    with pytest.raises(DatabaseError, match="does not exist"), transaction.atomic():
        send_message("orders", {"n": "lost"}, partition_key="k")
    with CaptureQueriesContext(connection) as captured:
        publish(PREPARE_AFTER + 1, atomic=False, partition_key="k")
    assert sent_statements(captured) == (
        ["INSERT"] * (PREPARE_AFTER - 1) + ["PREPARE", "EXECUTE", "EXECUTE"])
    lose_them()
    with CaptureQueriesContext(connection) as captured:
        alone = send_message("orders", {"n": "alone"}, partition_key="k")
    assert sent_statements(captured) == ["EXECUTE", "INSERT"]
    payloads = {row["offset"]: row["payload"]["n"] for row in stored_messages("orders")}
    assert payloads[alone.offset] == "alone" and "lost" not in payloads.values()
    assert len(payloads) == PREPARE_AFTER + PREPARE_AFTER + 1 + 1
