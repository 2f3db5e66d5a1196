"""The cursor publishing keeps between messages (``Store.publishing_cursor``): kept per
DB-API connection, replaced after a reconnect, and never hiding a statement from
Django's query log or from an ``execute_wrapper``."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from sqlqueue import send_message
from sqlqueue.storage.sql import store_for
from tests.conftest import stored_messages

pytestmark = pytest.mark.django_db(transaction=True)


def test_one_cursor_serves_every_publish_of_a_connection() -> None:
    store = store_for(connection)
    send_message("kept.cursor", {"n": 1}, partition_key="a")
    kept = store.publishing_cursor()
    send_message("kept.cursor", {"n": 2}, partition_key="a")
    with transaction.atomic():
        send_message("kept.cursor", {"n": 3}, partition_key="b")
    assert store.publishing_cursor() is kept
    assert [row["payload"]["n"] for row in stored_messages()] == [1, 2, 3]


def test_a_reconnect_gets_a_new_cursor_and_the_publish_goes_through() -> None:
    store = store_for(connection)
    send_message("kept.cursor", {"n": 1})
    before = store.publishing_cursor()
    connection.close()  # what Django does at the end of a request (CONN_MAX_AGE=0)
    sent = send_message("kept.cursor", {"n": 2})
    assert store.publishing_cursor() is not before
    assert [row["offset"] for row in stored_messages()][-1] == sent.offset


def test_a_failed_health_check_reconnects_before_the_publish() -> None:
    store = store_for(connection)
    send_message("kept.cursor", {"n": 1})
    before = store.publishing_cursor()
    wrapper: Any = connection  # CONN_HEALTH_CHECKS, as a new request finds it
    wrapper.health_check_enabled, wrapper.health_check_done = True, False
    try:
        wrapper.is_usable = lambda: False
        sent = send_message("kept.cursor", {"n": 2})
    finally:
        del wrapper.is_usable
        wrapper.health_check_enabled = False
    assert store.publishing_cursor() is not before
    assert sent.created and len(stored_messages()) == 2


def test_every_publish_is_logged_while_django_logs_queries() -> None:
    send_message("kept.cursor", {"n": 0})  # the kept cursor exists: it must not be used
    with CaptureQueriesContext(connection) as queries:
        send_message("kept.cursor", {"n": 1}, partition_key="k")
        send_message("kept.cursor", {"n": 2}, partition_key="k")
    inserts = [q["sql"] for q in queries.captured_queries
               if "INSERT" in q["sql"] and "queue_messages" in q["sql"]]
    assert len(inserts) == 2


def test_execute_wrappers_see_the_kept_cursors_statements() -> None:
    send_message("kept.cursor", {"n": 0})
    seen: list[Any] = []

    def spy(execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        send_message("kept.cursor", {"n": 1})
    assert any(b"queue_messages" in s if isinstance(s, bytes) else "queue_messages" in s
               for s in seen)


def test_another_thread_on_a_shared_connection_gets_a_cursor_of_its_own() -> None:
    """A connection shared between threads (a live-server test's in-memory SQLite): a
    thread that did not open the kept cursor never uses it, so its INSERT reads its own
    ``lastrowid``."""
    shared = connections[DEFAULT_DB_ALIAS]  # the wrapper itself: the proxy is per thread
    store = store_for(shared)
    send_message("kept.cursor", {"n": 0})
    kept = store.publishing_cursor()
    seen: list[Any] = []
    shared.inc_thread_sharing()
    try:
        worker = threading.Thread(target=lambda: seen.append(store.publishing_cursor()))
        worker.start()
        worker.join()
    finally:
        shared.dec_thread_sharing()
    assert seen and seen[0] is not kept
    assert store.publishing_cursor() is kept


def test_a_store_made_through_the_connection_proxy_holds_the_threads_wrapper() -> None:
    wrapper = connections[DEFAULT_DB_ALIAS]
    vars(wrapper).pop("_sqlqueue_kept_store", None)  # made afresh, from django.db.connection
    assert store_for(connection).connection is wrapper
    assert store_for(wrapper) is store_for(connection)


mysql_only = pytest.mark.skipif(connection.vendor != "mysql", reason="MySQL's InsertCursor")


@mysql_only
def test_mysql_keeps_a_lean_insert_cursor_inside_djangos_wrappers() -> None:
    from sqlqueue.storage.sql.mysql import InsertCursor

    send_message("kept.cursor", {"n": 0})
    kept: Any = store_for(connection).publishing_cursor()
    assert type(kept.cursor.cursor) is InsertCursor  # Django's wrapper, the backend's, ours
    sent = send_message("kept.cursor", {"n": 1})
    assert kept.lastrowid == sent.offset and kept.rowcount == 1


@mysql_only
def test_the_insert_cursor_raises_djangos_errors_and_leaves_the_connection_usable() -> None:
    from django.db import IntegrityError, ProgrammingError

    kept = store_for(connection).publishing_cursor()
    kept.execute("CREATE TEMPORARY TABLE kept_cursor_probe (id INT PRIMARY KEY)")
    kept.execute("INSERT INTO kept_cursor_probe VALUES (1)")
    with pytest.raises(IntegrityError):
        kept.execute("INSERT INTO kept_cursor_probe VALUES (1)")
    with pytest.raises(ProgrammingError, match="answer no rows"):
        kept.execute("SELECT id FROM kept_cursor_probe")
    with pytest.raises(ProgrammingError, match="no parameters"):
        kept.execute("INSERT INTO kept_cursor_probe VALUES (%s)", [2])
    kept.execute("INSERT INTO kept_cursor_probe VALUES (3)")  # the rows above were discarded
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM kept_cursor_probe ORDER BY id")
        assert cursor.fetchall() == ((1,), (3,))
        cursor.execute("DROP TEMPORARY TABLE kept_cursor_probe")


class _TracingProxy:
    """A DB-API connection wrapped as tracing libraries wrap it (their cursors record
    each statement): everything is passed through."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


@mysql_only
def test_a_proxied_db_api_connection_gets_its_own_cursors() -> None:
    import MySQLdb

    from sqlqueue.storage.sql.mysql import InsertCursor

    send_message("kept.cursor", {"n": 0})
    wrapper: Any = connections[DEFAULT_DB_ALIAS]
    raw = wrapper.connection
    wrapper.connection = _TracingProxy(raw)
    try:
        sent = send_message("kept.cursor", {"n": 1})
        kept: Any = store_for(connection).publishing_cursor()
        assert type(kept.cursor.cursor) is not InsertCursor
        assert isinstance(kept.cursor.cursor, MySQLdb.cursors.BaseCursor)
    finally:
        wrapper.connection = raw
    assert [row["offset"] for row in stored_messages()][-1] == sent.offset
