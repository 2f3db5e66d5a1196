"""F1 of the security audit: no Spark connection hands a local file to a server that asks.

A fake MySQL server on 127.0.0.1 (``fake_mysql``) answers statements with a
``LOCAL INFILE`` request for a canary file; the writer must never send it, whatever the
options, while its own LOAD DATA still serves the rows from memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sqlqueue.integrations.spark.connect import Database, Tls
from sqlqueue.integrations.spark.errors import InvalidOption
from sqlqueue.integrations.spark.infile import MemoryInfile
from sqlqueue.integrations.spark.options import SourceOptions
from sqlqueue.integrations.spark.rows import RowPreparer
from sqlqueue.integrations.spark.writer import ChunkPublisher, MessageWriter
from sqlqueue.models import QueueMessage
from tests.spark.fake_mysql import FakeServer

CANARY = b"SECRET-CANARY: this file must never leave the client"


@pytest.fixture
def canary(tmp_path: Path) -> str:
    path = tmp_path / "canary.txt"
    path.write_bytes(CANARY)
    return str(path)


@pytest.fixture
def rogue(canary: str) -> Iterator[FakeServer]:
    server = FakeServer(canary)
    yield server
    server.close()


def _write(server: FakeServer, **options: str) -> None:
    import pyarrow as pa

    parsed = SourceOptions.parse({"url": f"mysql://u:pw@127.0.0.1:{server.port}/x",
                                  "topic": "t", **options})
    batch = pa.RecordBatch.from_pylist([{"payload": '{"n": 1}', "id": "a"}])
    MessageWriter(parsed).write(iter([batch]))


@pytest.mark.parametrize("options", [{}, {"bulkLoad": "on"}, {"bulkLoad": "auto"},
                                     {"bulkLoad": "off"}])
def test_the_writer_sends_no_file_when_asked_after_any_statement(
        rogue: FakeServer, options: dict[str, str]) -> None:
    with pytest.raises(Exception, match=r"forbidden|refuses"):
        _write(rogue, **options)
    assert rogue.statements  # the server did ask
    assert rogue.received == []


def test_the_writer_advertises_no_local_files_on_its_main_connection(
        rogue: FakeServer) -> None:
    rogue.every_statement = False
    _write(rogue)  # INSERT, answered OK by the fake server
    assert rogue.client_flags and not rogue.client_flags[0] & 0x80  # CLIENT_LOCAL_FILES


def test_a_load_answered_with_another_file_name_sends_nothing(rogue: FakeServer) -> None:
    rogue.every_statement = False  # a real-looking server: it asks only after the LOAD
    with pytest.raises(Exception, match="refuses to send local file"):
        _write(rogue, bulkLoad="on")
    assert any(s.startswith("LOAD DATA LOCAL INFILE") for s in rogue.statements)
    assert rogue.received == []


def test_the_handler_serves_its_own_data_under_its_own_name_once(rogue: FakeServer) -> None:
    rogue.every_statement, rogue.honest = False, True
    database = Database.from_url(f"mysql://u:pw@127.0.0.1:{rogue.port}/x")
    data = b"x" * 100_000
    with database.connect(bulk_load=True) as db:
        infile = MemoryInfile(data)
        infile.install(db.raw)
        db.run(db.sql.load_messages(infile.name, "t"))
        assert infile.served
        with pytest.raises(Exception, match="refuses"):  # a second request: refused
            db.run(db.sql.load_messages(infile.name, "t"))
    assert rogue.received == [data]


def test_bulk_load_on_the_real_server_goes_through_load_data(db_url: str,
                                                              mysql_only: None) -> None:
    import pyarrow as pa

    options = SourceOptions.parse({"url": db_url, "topic": "bulk", "bulkLoad": "on"})
    rows = list(RowPreparer(options).prepare(pa.RecordBatch.from_pylist(
        [{"payload": f'{{"n": {n}}}', "id": f"m{n}"} for n in range(50)])))
    with options.database.connect() as db:
        publisher = ChunkPublisher(options, db)
        publisher.publish(rows)
    assert (publisher.report.bulk_loaded, publisher.report.inserted) == (50, 50)
    assert QueueMessage.objects.filter(topic="bulk").count() == 50


def test_bulk_load_is_opt_in() -> None:
    assert SourceOptions.parse({"url": "mysql://u@h/db", "topic": "t"}).bulk_load is False
    assert SourceOptions.parse({"url": "mysql://u@h/db", "bulkLoad": "on"}).bulk_load
    with pytest.raises(InvalidOption, match="bulkLoad"):
        SourceOptions.parse({"url": "mysql://u@h/db", "bulkLoad": "yes"})


def test_tls_options_reach_the_driver() -> None:
    options = SourceOptions.parse({"url": "mysql://u@h/db", "sslMode": "verify-identity",
                                   "sslCa": "/etc/ca.pem", "sslCert": "/c.pem",
                                   "sslKey": "/k.pem"})
    tls = options.database.tls
    assert tls is not None
    assert tls.connect_kwargs() == {"ssl_mode": "VERIFY_IDENTITY", "ssl": {
        "ca": "/etc/ca.pem", "cert": "/c.pem", "key": "/k.pem"}}


@pytest.mark.parametrize(("options", "error"), [
    ({"sslMode": "verify-ca"}, "needs 'sslCa'"),
    ({"sslMode": "strict"}, "sslMode"),
    ({"sslMode": "required", "sslCert": "/c.pem"}, "go together"),
])
def test_bad_tls_options_are_refused(options: dict[str, Any], error: str) -> None:
    with pytest.raises(InvalidOption, match=error):
        SourceOptions.parse({"url": "mysql://u@h/db", **options})


def test_a_verifying_connection_refuses_a_server_without_tls(rogue: FakeServer,
                                                             tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not used: the server offers no TLS")
    database = Database.from_url(f"mysql://u:pw@127.0.0.1:{rogue.port}/x",
                                 tls=Tls(mode="verify-ca", ca=str(ca)))
    with pytest.raises(Exception, match=r"(?i)ssl|tls"):
        database.connect()
    assert rogue.received == [] and rogue.statements == []


# -- F8: secrets never in a repr or an error ---------------------------------------------------

def test_reprs_of_settings_and_options_hide_the_password() -> None:
    options = SourceOptions.parse({"url": "mysql://u:Sup3rSecret@db.example:3306/shop",
                                   "topic": "t"})
    override = SourceOptions.parse({"url": "mysql://u@db.example/shop",
                                    "password": "0ther-Secret"})
    for text in (repr(options), repr(options.database), str(options), repr(override)):
        assert "Sup3rSecret" not in text and "0ther-Secret" not in text
    assert options.database.password == "Sup3rSecret"  # still there, just not shown


@pytest.mark.parametrize("url", [
    "mysql://root:hunter2/x@127.0.0.1:3306/db",  # the audit's case: '/' in the password
    "mysql://root:123/hunter2@127.0.0.1:3306/db",  # a numeric start: a valid-looking port
    "mysql://root:hun?ter2@127.0.0.1:3306/db",
    "mysql://root:hun#ter2@127.0.0.1:3306/db",
])
def test_an_unencoded_password_never_reaches_an_error(url: str) -> None:
    with pytest.raises(InvalidOption) as raised:
        SourceOptions.parse({"url": url, "topic": "t"})
    assert "hunter2" not in str(raised.value) and "ter2" not in str(raised.value)
    assert "percent-encode" in str(raised.value)


def test_options_from_settings_keep_the_password_out_of_the_url(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import connections

    from sqlqueue.integrations.spark.settings import options_from_settings

    for key, value in {"ENGINE": "django.db.backends.mysql", "NAME": "shop", "USER": "u",
                       "PASSWORD": "Sup3r/Secret", "HOST": "db.example",
                       "PORT": "3306"}.items():
        monkeypatch.setitem(connections["default"].settings_dict, key, value)
    options = options_from_settings("default")
    assert "Sup3r" not in options["url"] and options["password"] == "Sup3r/Secret"
    parsed = SourceOptions.parse({**options, "topic": "t"})
    assert parsed.database.password == "Sup3r/Secret" and parsed.database.host == "db.example"


# -- the audit's smaller fixes -------------------------------------------------------------

@pytest.mark.parametrize("value", ["²", "٣", "1²", "-1", "+3", "1e3"])
def test_starting_offsets_are_ascii_digits(value: str) -> None:
    with pytest.raises(InvalidOption, match="startingOffsets"):
        SourceOptions.parse({"url": "mysql://u@h/db", "startingOffsets": value})
    assert SourceOptions.parse({"url": "mysql://u@h/db",
                                "startingOffsets": " 42 "}).starting_offsets == "42"


def test_invalid_row_says_what_stays_committed() -> None:
    from sqlqueue.integrations.spark.errors import InvalidRow

    doc = " ".join((InvalidRow.__doc__ or "").split())
    assert "before the task writes anything" not in doc
    assert "Chunks committed before it" in doc
