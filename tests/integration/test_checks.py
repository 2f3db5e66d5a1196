"""System checks: settings errors fire with their ids; database checks read the server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.checks import Error
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection, connections
from django.test import override_settings

from sqlqueue import ConfigurationError, send_message
from sqlqueue.checks import check_database, check_settings
from sqlqueue.checks.mysql import PACKET_MARGIN
from sqlqueue.migrations._collation import binary_collation
from sqlqueue.storage.sql import store_for

pytestmark = pytest.mark.django_db


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


def test_default_settings_pass_every_check() -> None:
    assert check_settings() == []
    assert check_database(databases=["default"]) == []


@pytest.mark.django_db(transaction=True, databases=["default", "routes"])  # every alias
def test_bad_settings_stop_manage_py_check(settings: Any) -> None:
    settings.SQLQUEUE = {"LEASE_DURATION": 5, "LEASE_RENEW_INTERVAL": 5, "BATCH_SIZE": "ten"}
    with pytest.raises(SystemCheckError) as raised:
        call_command("check")
    assert "sqlqueue.E005" in str(raised.value)
    assert "sqlqueue.E003" in str(raised.value)
    assert all(isinstance(m, Error) for m in check_settings())


def test_runtime_refuses_settings_the_checks_reject(settings: Any) -> None:
    settings.SQLQUEUE = {"MAX_PAYLOAD_BYTES": -1}
    with pytest.raises(ConfigurationError, match=r"MAX_PAYLOAD_BYTES.*sqlqueue.E004"):
        send_message("t", 1)


def test_settings_are_reread_after_a_change(settings: Any) -> None:
    settings.SQLQUEUE = {"MAX_PAYLOAD_BYTES": 5}
    from sqlqueue import InvalidMessage

    with pytest.raises(InvalidMessage, match="limit is 5 bytes"):
        send_message("t", "too long")


def test_unknown_database_alias(settings: Any) -> None:
    settings.SQLQUEUE = {"DATABASE": "queue"}
    assert ids(check_settings()) == ["sqlqueue.E007"]
    assert check_database(databases=["default"]) == []  # reported once, by the settings check


@pytest.fixture
def session_variable() -> Iterator[Any]:
    """Change a MySQL session variable for one test; the connection is closed afterwards."""
    if connection.vendor != "mysql":
        pytest.skip("session variables are MySQL/MariaDB's")

    def run(sql: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(sql)

    yield run
    connection.close()


def test_read_uncommitted_is_an_error(session_variable: Any) -> None:
    session_variable("SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
    assert ids(check_database(databases=["default"])) == ["sqlqueue.E105"]


def test_serializable_is_a_warning(session_variable: Any) -> None:
    session_variable("SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE")
    assert ids(check_database(databases=["default"])) == ["sqlqueue.W101"]


def test_a_connection_without_utf8mb4_is_an_error(session_variable: Any) -> None:
    session_variable("SET NAMES latin1")
    assert ids(check_database(databases=["default"])) == ["sqlqueue.E103"]


def test_packet_smaller_than_the_payload_limit_warns(settings: Any, session_variable: Any) -> None:
    settings.SQLQUEUE = {"MAX_PAYLOAD_BYTES": 1 << 30}
    assert ids(check_database(databases=["default"])) == ["sqlqueue.W102"]


@pytest.mark.django_db(transaction=True)  # ALTER TABLE commits implicitly
@pytest.mark.parametrize("charset", ["latin1", "utf8mb4 COLLATE utf8mb4_general_ci"])
# One of the RFC's five tables, and one of sqlqueue's own four (all nine are checked).
@pytest.mark.parametrize("table", ["queue_subscriber_heartbeats", "queue_flow_control"])
def test_tables_not_binary_utf8mb4_are_an_error(session_variable: Any, charset: str,
                                                table: str) -> None:
    session_variable(f"ALTER TABLE {table} CONVERT TO CHARACTER SET {charset}")
    try:
        messages = check_database(databases=["default"])
        assert ids(messages) == ["sqlqueue.E104"]
        assert table in messages[0].msg
    finally:
        session_variable(
            f"ALTER TABLE {table} "
            f"CONVERT TO CHARACTER SET utf8mb4 COLLATE {binary_collation(connection)}"
        )


@pytest.fixture
def postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's checks")


def test_postgresql_as_configured_for_the_tests_passes(postgresql: None) -> None:
    """Version 14+, UTF8, READ COMMITTED, a role that sees every session: no message."""
    assert ids(check_database(databases=["default"])) == []


@pytest.mark.parametrize("level", ["REPEATABLE_READ", "SERIALIZABLE"])
def test_postgresql_isolation_above_read_committed_is_an_error(
    postgresql: None, level: str,
) -> None:
    from psycopg import IsolationLevel

    options = connection.settings_dict.setdefault("OPTIONS", {})
    options["isolation_level"] = IsolationLevel[level]
    try:
        messages = check_database(databases=["default"])
    finally:
        del options["isolation_level"]
    assert ids(messages) == ["sqlqueue.E106"]
    assert level.replace("_", " ") in messages[0].msg


def test_postgresql_role_blind_to_other_sessions_warns(
    postgresql: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    statements_class = type(store_for(connection).sql)
    monkeypatch.setattr(statements_class, "horizon_privileges",
                        lambda self: ("SELECT false", []))
    assert ids(check_database(databases=["default"])) == ["sqlqueue.W105"]


def test_sqlite_without_immediate_transactions_warns() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's transaction mode")
    options = connection.settings_dict["OPTIONS"]
    saved = options.pop("transaction_mode")
    try:
        assert ids(check_database(databases=["default"])) == ["sqlqueue.W104"]
    finally:
        options["transaction_mode"] = saved


def test_other_databases_are_not_inspected() -> None:
    assert check_database(databases=["other"]) == []


def test_packet_that_cannot_hold_an_escaped_payload_warns(settings: Any,
                                                          session_variable: Any) -> None:
    # A payload travels as an escaped literal, up to twice its size: with 8 MiB payloads a
    # 16 MiB max_allowed_packet is too small (an 8 MiB payload of quotes failed with 1153).
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        packet = int(cursor.fetchone()[0])
    settings.SQLQUEUE = {"MAX_PAYLOAD_BYTES": packet // 2}
    assert ids(check_database(databases=["default"])) == ["sqlqueue.W102"]


def test_packet_that_cannot_hold_an_escaped_payload_and_metadata_warns(
        settings: Any, session_variable: Any) -> None:
    """N4: metadata has the same cap as the payload and travels escaped beside it; a
    limit a payload alone fits in (the audit's 6 MiB on a 16 MiB server) warns."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        packet = int(cursor.fetchone()[0])
    settings.SQLQUEUE = {"MAX_PAYLOAD_BYTES": (packet - PACKET_MARGIN) // 3}
    assert ids(check_database(databases=["default"])) == ["sqlqueue.W102"]
    settings.SQLQUEUE = {"MAX_PAYLOAD_BYTES": (packet - PACKET_MARGIN) // 4}
    assert ids(check_database(databases=["default"])) == []


@pytest.fixture
def pooled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check sees a connection pooler (a pg_backend_pid() other than the connection's)
    and no way past it (every session the listener could open is pooled too)."""
    monkeypatch.setattr("sqlqueue.checks.poolers.reaches_server_directly",
                        lambda cursor, pid: False)
    monkeypatch.setattr("sqlqueue.wakeups.postgresql.reaches_server_directly",
                        lambda cursor, pid: False)


@pytest.fixture
def pooled_with_a_way_past(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pooler the listener can reach past: the server behind answers it directly."""
    monkeypatch.setattr("sqlqueue.checks.poolers.reaches_server_directly",
                        lambda cursor, pid: False)


def without_binding_warning(messages: list[Any]) -> list[Any]:
    """The messages but W107, which the server-side binding tier (make
    test-postgres-server-binding) adds to every pooled connection, as it should."""
    if connection.settings_dict.get("OPTIONS", {}).get("server_side_binding"):
        return [m for m in messages if m.id != "sqlqueue.W107"]
    return messages


def test_postgresql_through_a_pooler_without_a_listener_alias_warns(
        postgresql: None, pooled: None) -> None:
    (message,) = without_binding_warning(check_database(databases=["default"]))
    assert message.id == "sqlqueue.W106"
    assert "WAKEUP_LISTEN_DATABASES" in (message.hint or "")
    assert "is not the server behind it" in message.msg  # why it cannot go past


def test_postgresql_through_a_pooler_the_listener_can_reach_past_is_fine(
        postgresql: None, pooled_with_a_way_past: None) -> None:
    """The listener will listen straight to the server behind the pooler (issue 39)."""
    assert ids(without_binding_warning(check_database(databases=["default"]))) == []


@pytest.mark.django_db(transaction=True, databases=["default", "routes"])
def test_every_alias_sqlqueue_uses_gets_the_pooler_checks(
        postgresql: None, pooled: None) -> None:
    """A routed database is consumed (W106 and W107), a read replica only read (W107);
    each is checked when ``--database`` names it (issue 39)."""
    options = connections["routes"].settings_dict.setdefault("OPTIONS", {})
    already = options.get("server_side_binding")
    options["server_side_binding"] = True
    try:
        with override_settings(SQLQUEUE={"ROUTES": {"other.*": "routes"}}):
            routed = check_database(databases=["routes"])
        with override_settings(SQLQUEUE={"READ_REPLICAS": {"default": "routes"}}):
            replica = check_database(databases=["routes"])
            both = check_database(databases=["default", "routes"])
    finally:
        if already is None:
            del options["server_side_binding"]
        else:
            options["server_side_binding"] = already
    assert ids(routed) == ["sqlqueue.W106", "sqlqueue.W107"]
    assert all("'routes'" in m.msg for m in routed)
    assert ids(replica) == ["sqlqueue.W107"]
    # In the server-side binding tier 'default' has its own W107 too: left aside, the
    # routes alias's W107 stays.
    kept = [m for m in both
            if not (m.id == "sqlqueue.W107" and m.msg.startswith("Database 'default'"))]
    assert ids(kept) == ["sqlqueue.W106", "sqlqueue.W107"]


@pytest.mark.parametrize("sqlqueue_settings", [
    {"WAKEUP_LISTEN_DATABASES": {"default": "routes"}},
    {"WAKEUP_LISTEN_DATABASES": {"default": "default"}},  # a session-mode pool
    {"WAKEUPS": False}])
def test_postgresql_through_a_pooler_with_a_listener_alias_or_no_wakeups_is_fine(
        postgresql: None, pooled: None, sqlqueue_settings: dict[str, object]) -> None:
    with override_settings(SQLQUEUE=sqlqueue_settings):
        assert ids(without_binding_warning(check_database(databases=["default"]))) == []


def test_postgresql_server_side_binding_through_a_pooler_warns(
        postgresql: None, pooled: None) -> None:
    options = connection.settings_dict.setdefault("OPTIONS", {})
    already = options.get("server_side_binding")
    options["server_side_binding"] = True
    try:
        with override_settings(SQLQUEUE={"WAKEUPS": False}):
            messages = check_database(databases=["default"])
    finally:
        if already is None:
            del options["server_side_binding"]
        else:
            options["server_side_binding"] = already
    assert ids(messages) == ["sqlqueue.W107"]
    assert "1.21" in messages[0].msg


def test_postgresql_a_direct_connection_is_not_taken_for_a_pooler(postgresql: None) -> None:
    from sqlqueue.storage.sql.postgresql import reaches_server_directly

    connection.ensure_connection()
    with connection.cursor() as cursor:
        assert reaches_server_directly(cursor, connection.connection.info.backend_pid)
