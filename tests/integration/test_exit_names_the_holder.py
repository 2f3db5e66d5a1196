"""A graceful exit (``--until-empty``) that leaves a watermark behind its acks because an
unrelated write transaction is open says which one, and for how long (issue 51): its
session (PostgreSQL's pid, MariaDB's connection id), database, start, state and
statement, from ``oldest_writer`` (pg_stat_activity, INNODB_TRX). On SQLite, one writer
at a time, nothing can hold the horizon back: no holder, and the watermark moves."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction

from sqlqueue import send_message, storage
from sqlqueue.models import PartitionOffset
from tests.integration.consuming_helpers import drain, register  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
TOPIC, OTHER = "exit.holder", "exit.holder.other"


@pytest.fixture
def holder() -> Iterator[str]:
    """Another session's write transaction (this thread's connection is its own), open
    for the test: the insert of a message of another topic, never committed; yields its
    session id."""
    ready, done, session = threading.Event(), threading.Event(), []

    def hold() -> None:
        try:
            with transaction.atomic():
                send_message(OTHER, {}, id="held")
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()" if connection.vendor ==
                                   "postgresql" else "SELECT CONNECTION_ID()")
                    session.append(str(cursor.fetchone()[0]))
                ready.set()
                done.wait(60)
                transaction.set_rollback(True)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield session[0]
    finally:
        done.set()
        thread.join(30)


@pytest.mark.usefixtures("server_database")
@pytest.mark.exit_settles
def test_an_exit_behind_an_open_writer_names_it(holder: str, register) -> None:  # noqa: F811
    register(TOPIC, "g", lambda message: None)
    sent = send_message(TOPIC, {}, partition_key="p")  # after the holder's insert
    runner = drain(["g"], [TOPIC])
    assert len(runner.exit.behind) == 1 and "g" in runner.exit.behind[0]
    held_by = runner.exit.held_by
    assert held_by is not None
    # The oldest writer: the holder, unless another session's began even earlier (on a
    # shared MariaDB server INNODB_TRX lists every database's).
    with connection.cursor() as cursor:
        oldest = storage.store(connection).oldest_writer(cursor)
    assert oldest is not None and oldest.started_ms <= held_by.started_ms + 1000
    if held_by.session == holder:
        assert held_by.open_ms > 0 and held_by.database == connection.settings_dict["NAME"]
        assert f"session {holder}" in held_by.describe()
    watermark = PartitionOffset.objects.filter(consumer_group="g", topic=TOPIC,
                                               partition_key="p").first()
    assert watermark is None or watermark.offset_acked < sent.offset


@pytest.mark.usefixtures("server_database")
@pytest.mark.exit_settles
def test_runconsumer_until_empty_says_which_transaction_held_the_watermark(
        holder: str, register) -> None:  # noqa: F811
    register(TOPIC, "g", lambda message: None)
    send_message(TOPIC, {}, partition_key="p")
    out = StringIO()
    call_command("runconsumer", "--group", "g", "--until-empty", stdout=out)
    said = out.getvalue()
    assert "Watermark left behind the acks of" in said, said
    assert "the write horizon waits for session" in said and "open for" in said, said


def test_sqlite_names_no_holder(register) -> None:  # noqa: F811
    if connection.vendor != "sqlite":
        pytest.skip("the SQLite side of the test above")
    register(TOPIC, "g", lambda message: None)
    sent = send_message(TOPIC, {}, partition_key="p")
    runner = drain(["g"], [TOPIC])
    with connection.cursor() as cursor:
        assert storage.store(connection).oldest_writer(cursor) is None
    assert runner.exit.behind == [] and runner.exit.held_by is None
    assert PartitionOffset.objects.get(consumer_group="g", topic=TOPIC,
                                       partition_key="p").offset_acked >= sent.offset
