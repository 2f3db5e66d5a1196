"""The Messages and Dead letters pages stay bounded on a log of millions (issue 52).

Two kinds of proof that do not depend on the machine's speed:

* the statements each page runs (captured on every database): nothing de-duplicates
  ``queue_messages`` (``DISTINCT``: Django's field list filters did, over the whole log)
  and every count of it stops at a ``LIMIT`` (Django's paginator counted the whole log);
* on MariaDB and PostgreSQL, with a log of 330,000 rows, the rows each page reads of
  ``queue_messages``: MariaDB's handler counters of the session (index entries and rows
  read, whatever the plan), PostgreSQL's ``EXPLAIN ANALYZE`` of each statement the page
  ran (rows returned and filtered out by every scan of the table). A page stays within
  ``ROW_BUDGET``, a few percent of the table, whatever the filter, search or depth; the
  pages before issue 52 read the whole table for each of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from sqlqueue import send_message
from sqlqueue.models import DeadLetter, PartitionOffset, QueueMessage
from sqlqueue.operations import COUNT_CAP
from tests.integration.test_admin import admin_client

__all__ = ["admin_client"]  # a fixture of test_admin
A = "/admin/sqlqueue"
BIG = 300_000
DEAD = 30_000
EARLY = 500
#: rows of queue_messages one page may read of the 330,000: the capped count (COUNT_CAP +
#: 1), a page past the counted ones (its OFFSET, up to COUNT_CAP), the page, and the dead
#: letters twice (the Dead letters lists read their topics' rows; the Messages list steps
#: over the dead letters stored among the newest rows); never the 300,000 of the backlog.
#: Before issue 52 each of these pages read the whole table at least twice (660,000).
ROW_BUDGET = 3 * COUNT_CAP + 2 * DEAD
#: rows the consumer-group filter of a group with 100 of the dead letters may read: its
#: own index entries and rows, and the small tables' (positions, sessions, users)
RARE_GROUP_BUDGET = 2_000


def page_urls(newest: int, dead: int, middle: int, topic: str, dead_topic: str) -> list[str]:
    """Each changelist plain, searched, filtered and paged deep, and the detail pages."""
    original = dead_topic.removesuffix("_dlq")
    return [
        f"{A}/queuemessage/",
        f"{A}/queuemessage/?q=k7",
        f"{A}/queuemessage/?q=m123",
        f"{A}/queuemessage/?q={newest}",
        f"{A}/queuemessage/?q=no-such-thing",
        f"{A}/queuemessage/?topic={topic}",
        f"{A}/queuemessage/?topic=early",
        f"{A}/queuemessage/?created_at__range__gte=2000-01-01"
        f"&created_at__range__lte=2000-01-02",
        f"{A}/queuemessage/?p=200",
        f"{A}/queuemessage/?offset__lt={middle}",
        f"{A}/queuemessage/{newest}/change/",
        f"{A}/deadletter/",
        f"{A}/deadletter/?q=k7",
        f"{A}/deadletter/?q=no-such-thing",
        f"{A}/deadletter/?consumer_group=g",
        f"{A}/deadletter/?original_topic={original}",
        f"{A}/deadletter/?p=50",
        f"{A}/deadletter/?failed_at__range__gte=2000-01-01&failed_at__range__lte=2000-01-02",
        f"{A}/deadletter/replay-matching/?consumer_group=g",
        f"{A}/deadletter/{dead}/change/",
    ]


def log_statements(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if "queue_messages" in q["sql"]]


def unbounded(statements: list[str]) -> list[str]:
    """Statements that de-duplicate the log or count it without a LIMIT."""
    return [sql for sql in statements
            if "DISTINCT" in sql.upper()
            or ("COUNT(" in sql.upper() and "LIMIT" not in sql.upper())]


@pytest.mark.django_db(transaction=True)
def test_no_page_counts_or_deduplicates_the_whole_log(admin_client: Client) -> None:
    """Fails before issue 52: the topic, group and original-topic filters ran ``SELECT
    DISTINCT`` over the log, and the paginator ``COUNT(*)`` over every matching row."""
    for n in range(30):
        send_message("orders", {"n": n}, partition_key=f"k{n % 8}", id=f"m{n}")
    send_message("early", {"n": 0}, partition_key="k0")
    dead = QueueMessage.objects.create(
        topic="orders_dlq", partition_key="k7", id="d1", payload=b"{}", created_at=1,
        published_at=1, consumer_group="g", original_topic="orders", failure_count=3,
        last_error="ValueError: no")
    PartitionOffset.objects.create(consumer_group="g", topic="orders", partition_key="k0",
                                   offset_acked=0, updated_at=1)
    newest = QueueMessage.objects.filter(topic="orders").order_by("-offset").first()
    assert newest is not None
    for url in page_urls(newest.offset, dead.offset, newest.offset, "orders", "orders_dlq"):
        with CaptureQueriesContext(connection) as captured:
            response = admin_client.get(url)
        assert response.status_code == 200, url
        statements = log_statements(captured)
        assert statements, url
        assert unbounded(statements) == [], url


@pytest.mark.django_db(transaction=True)
def test_the_lists_say_what_they_count_and_search(admin_client: Client) -> None:
    for n in range(3):
        send_message("orders", {"n": n}, partition_key="k1", id=f"m{n}")
    page = admin_client.get(f"{A}/queuemessage/").content.decode()
    assert "3 messages" in page
    assert "Finds an offset (a number), a partition key or a message id" in page
    assert 'id="sqlqueue-retention-note"' in page and "RETENTION" in page
    found = admin_client.get(f"{A}/queuemessage/?q=m1").content.decode()
    assert "1 message" in found


@pytest.mark.django_db(transaction=True)
def test_the_messages_page_says_when_acked_messages_go(admin_client: Client,
                                                      settings: Any) -> None:
    """Issue 53 F3: "0 messages" on a busy system, with no word why (garbage collection
    deletes what every group acked, at once by default)."""
    def note() -> str:
        page = admin_client.get(f"{A}/queuemessage/").content.decode()
        found = re.search(r'id="sqlqueue-retention-note">([^<]*)<', page)
        assert found is not None, page
        return " ".join(found.group(1).split())

    assert "RETENTION&quot;] at 0, the default" in note()
    assert "timedelta(days=7)" in note()
    settings.SQLQUEUE = {"RETENTION": 7 * 86400}
    assert "deletes a message 7 days after every consumer group" in note()
    settings.SQLQUEUE = {"RETENTION": 90}
    assert "90 seconds after" in note()


@pytest.mark.django_db(transaction=True)
def test_a_capped_list_says_more_than_and_steps_older(admin_client: Client,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the cap the page says "more than" and its "older" link lists the offsets
    below the page (a keyset step), with the filters kept."""
    from sqlqueue.admin.bounded import BoundedPaginator

    monkeypatch.setattr(BoundedPaginator, "cap", 150)
    for n in range(260):
        send_message("orders", {"n": n}, partition_key="k1", id=f"m{n}")
    offsets = list(QueueMessage.objects.order_by("-offset").values_list("offset", flat=True))
    page = admin_client.get(f"{A}/queuemessage/?topic=orders").content.decode()
    assert "more than 150 messages (counting stops there)" in page
    older = re.search(r'href="\?([^"]*offset__lt=(\d+)[^"]*)" id="sqlqueue-older"', page)
    assert older is not None, page
    assert "topic=orders" in older.group(1)
    assert int(older.group(2)) == offsets[99]
    below = admin_client.get(f"{A}/queuemessage/?{older.group(1).replace('&amp;', '&')}")
    text = below.content.decode()
    assert f"below offset {offsets[99]}" in text
    assert f">{offsets[100]}<" in text and f">{offsets[99]}<" not in text
    sorted_otherwise = admin_client.get(f"{A}/queuemessage/?o=2").content.decode()
    assert 'id="sqlqueue-older"' not in sorted_otherwise  # "older" follows the offsets
    deep = admin_client.get(f"{A}/queuemessage/?p=500")  # past the counted pages:
    assert deep.status_code == 200  # the last counted one (rows 101 to 150), and older
    text = deep.content.decode()
    assert f">{offsets[100]}<" in text and f">{offsets[149]}<" in text
    assert f">{offsets[150]}<" not in text
    assert f"offset__lt={offsets[149]}" in text


@pytest.mark.django_db(transaction=True)
def test_search_finds_by_offset_key_and_id_only(admin_client: Client) -> None:
    a = send_message("orders", {"n": 1}, partition_key="cust-1", id="inv-1")
    b = send_message("orders", {"n": 2}, partition_key="cust-2", id="inv-2")
    c = send_message("refunds", {"n": 3}, partition_key="cust-1", id="inv-3")

    def shown(q: str, extra: str = "") -> set[int]:
        page = admin_client.get(f"{A}/queuemessage/?q={q}{extra}").content.decode()
        return {o for o in (a.offset, b.offset, c.offset)
                if f"/queuemessage/{o}/change/" in page}

    assert shown("cust-1") == {a.offset, c.offset}
    assert shown("cust-1", "&topic=orders") == {a.offset}
    assert shown("inv-2") == {b.offset}
    assert shown(str(c.offset)) == {c.offset}
    assert shown("cust") == set()  # exact, not a substring


@pytest.mark.django_db(transaction=True)
def test_more_topics_than_a_list_shows(admin_client: Client) -> None:
    """1,050 topics (a third with dead letters): every dead letter is listed (the pages
    knew the first 1,000 topics only, so dead letters of the later ones were never
    shown), each page runs a few statements more on the log than with three topics (it
    ran one per topic, three per topic for a search), and a topic filter lists 100 of them
    and takes any other typed into its field."""
    from sqlqueue.admin.bounded import LISTED_CHOICES

    def make(topics: int) -> None:
        QueueMessage.objects.all().delete()
        PartitionOffset.objects.all().delete()
        QueueMessage.objects.bulk_create(
            [QueueMessage(topic=f"t{n:04}", partition_key="k", id=f"m{n}", payload=b"{}",
                          created_at=1, published_at=1) for n in range(topics)]
            + [QueueMessage(topic=f"t{n:04}_dlq", partition_key="k", id=f"d{n}",
                            payload=b"{}", created_at=1, published_at=1, consumer_group="g",
                            original_topic=f"t{n:04}", failure_count=1, last_error="no")
               for n in range(0, topics, 3)], batch_size=500)
        PartitionOffset.objects.bulk_create(
            [PartitionOffset(consumer_group="g", topic=f"t{n:04}", partition_key="k",
                             offset_acked=0, updated_at=1) for n in range(topics)],
            batch_size=500)

    urls = [f"{A}/queuemessage/", f"{A}/queuemessage/?q=m7", f"{A}/queuemessage/?q=k",
            f"{A}/deadletter/", f"{A}/deadletter/?q=d9", f"{A}/deadletter/?consumer_group=g"]

    def statements() -> list[int]:
        counts = []
        for url in urls:
            with CaptureQueriesContext(connection) as captured:
                assert admin_client.get(url).status_code == 200, url
            counts.append(len(log_statements(captured)))
        return counts

    make(3)
    few = statements()
    make(1_050)
    # A statement per 200 topics at most (SQLite's limits on one statement's terms and
    # variables), where it was one per topic (three per topic for a search).
    many = statements()
    assert all(n <= f + 14 for n, f in zip(many, few, strict=True)), (few, many)
    last = DeadLetter.objects.get(topic="t1047_dlq")
    page = admin_client.get(f"{A}/deadletter/?original_topic=t1047").content.decode()
    assert f"/deadletter/{last.offset}/change/" in page
    assert "1 dead letter" in page
    listing = admin_client.get(f"{A}/queuemessage/?topic=t1049").content.decode()
    assert "The first 100 of 1050 are listed: type another one." in listing
    assert 'name="topic" value="t1049"' in listing
    choices = set(re.findall(r'href="\?topic=(t\d{4})"', listing))
    assert len(choices) == LISTED_CHOICES + 1  # the first 100 and the chosen one
    assert "t1049" in choices and "t0100" not in choices


# -- a log of 330,000 rows on MariaDB and PostgreSQL ---------------------------------------

def fill(topic: str, count: int, partitions: int, dead_of: str = "", group: str = "g") -> None:
    """``count`` rows in one INSERT ... SELECT (the SEQUENCE engine on MariaDB,
    generate_series on PostgreSQL), created one millisecond apart."""
    if connection.vendor == "mysql":
        rows, n = f"seq_1_to_{count}", "seq"
        key, ident = f"CONCAT('k', seq MOD {partitions})", f"CONCAT('{group}m', seq)"
        now = "(UNIX_TIMESTAMP() * 1000)"
    else:
        rows, n = f"generate_series(1, {count}) AS seq", "seq"
        key, ident = f"('k' || seq %% {partitions})", f"('{group}m' || seq)"
        now = "(EXTRACT(EPOCH FROM now()) * 1000)::bigint"
    columns = "topic, partition_key, id, payload, created_at, published_at"
    values = f"%s, {key}, {ident}, %s, {now} + {n}, {now} + {n}"
    params: list[Any] = [topic, b'{"pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}']
    if dead_of:
        columns += ", consumer_group, original_topic, failed_at, failure_count, last_error"
        values += f", %s, %s, {now} + {n}, 3, 'ValueError: no'"
        params += [group, dead_of]
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO queue_messages ({columns}) SELECT {values} FROM {rows}",
                       params)
        if connection.vendor == "mysql":
            cursor.execute("ANALYZE TABLE queue_messages")
            cursor.fetchall()
        else:
            cursor.execute("ANALYZE queue_messages")


def rows_read_mysql(client: Client, url: str) -> tuple[int, int]:
    """(status, rows and index entries the session read) of one page, from MariaDB's
    handler counters: every read of every table (the page's other tables are small).
    Each statement the page ran on queue_messages is also EXPLAINed (under Django's
    connection, its collation included): none may scan the table (type ALL)."""
    def handler_reads() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SHOW SESSION STATUS LIKE 'Handler_read%%'")
            return sum(int(value) for _, value in cursor.fetchall())
    before = handler_reads()
    with CaptureQueriesContext(connection) as captured:
        status = client.get(url).status_code
    read = handler_reads() - before - 7  # the SHOW itself reads 7 rows
    with connection.cursor() as cursor:
        for sql in log_statements(captured):
            if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
                continue
            cursor.execute("EXPLAIN " + sql)
            columns = [c[0] for c in cursor.description]
            for row in cursor.fetchall():
                step = dict(zip(columns, row, strict=True))
                assert not (step["table"] == "queue_messages" and step["type"] == "ALL"), (
                    url, sql, step)
    return status, read


def _scans(plan: Any) -> Iterator[dict[str, Any]]:
    if isinstance(plan, dict):
        if plan.get("Relation Name") == "queue_messages":
            yield plan
        for child in plan.get("Plans", []):
            yield from _scans(child)


def rows_read_postgresql(client: Client, url: str) -> tuple[int, int]:
    """(status, rows the page's statements read of queue_messages): each statement run
    again under EXPLAIN ANALYZE, the rows every scan of the table returned or filtered
    out, over all its loops."""
    with CaptureQueriesContext(connection) as captured:
        status = client.get(url).status_code
    total = 0
    with connection.cursor() as cursor:
        for sql in log_statements(captured):
            if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
                continue
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
            plan = cursor.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            for scan in _scans(plan[0]["Plan"]):
                loops = int(scan.get("Actual Loops", 1))
                total += loops * int(scan.get("Actual Rows", 0)
                                     + scan.get("Rows Removed by Filter", 0)
                                     + scan.get("Rows Removed by Index Recheck", 0))
    return status, total


@pytest.mark.django_db(transaction=True)  # ANALYZE TABLE commits on MariaDB
@pytest.mark.parametrize("dead_first", [False, True],
                         ids=["dead letters newest", "dead letters under the backlog"])
def test_every_page_reads_a_bounded_part_of_a_big_log(admin_client: Client,
                                                      server_database: None,
                                                      dead_first: bool) -> None:
    """330,000 rows: 500 of an early topic, 300,000 over 64 partitions, 30,000 dead letters
    of one group, written after the backlog or before it (a failure storm, then a backlog:
    a newest-first list walking the primary key would read the whole backlog before the
    first dead letter). Before issue 52 the Messages page read the whole table twice
    (DISTINCT topic, COUNT(*)), the Dead letters page too (DISTINCT group, DISTINCT topic,
    COUNT)."""
    fill("early", EARLY, 4)
    if dead_first:
        fill("big_dlq", DEAD, 64, dead_of="big")
    fill("big", BIG, 64)
    if not dead_first:
        fill("big_dlq", DEAD, 64, dead_of="big")
    PartitionOffset.objects.bulk_create([
        PartitionOffset(consumer_group="g", topic="big", partition_key=f"k{n}",
                        offset_acked=0, updated_at=1) for n in range(64)])
    newest = QueueMessage.objects.filter(topic="big").order_by("-offset").first()
    dead = DeadLetter.objects.order_by("-offset").first()
    assert newest is not None and dead is not None
    rows_read = rows_read_mysql if connection.vendor == "mysql" else rows_read_postgresql
    over = {}
    for url in page_urls(newest.offset, dead.offset, newest.offset - BIG // 2, "big",
                         "big_dlq"):
        status, read = rows_read(admin_client, url)
        assert status == 200, url
        if read > ROW_BUDGET:
            over[url] = read
    assert over == {}, f"pages that read more than {ROW_BUDGET} rows: {over}"
    # A group with few of the dead letters: its filter reads its own (the index
    # idx_group_topic_offset), not the 30,000 of the others (fails before issue 52's
    # second session: 30,000 and more).
    fill("big_dlq", 100, 64, dead_of="big", group="rare")
    PartitionOffset.objects.create(consumer_group="rare", topic="big", partition_key="k0",
                                   offset_acked=0, updated_at=1)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE TABLE queue_messages" if connection.vendor == "mysql"
                       else "ANALYZE queue_messages")
        if connection.vendor == "mysql":
            cursor.fetchall()
    status, read = rows_read(admin_client, f"{A}/deadletter/?consumer_group=rare")
    assert status == 200
    assert read <= RARE_GROUP_BUDGET, read


@pytest.mark.django_db(transaction=True)
def test_the_date_filters_find_the_rows_of_their_range(admin_client: Client) -> None:
    """The creation range is read as a range of offsets (binary search on the primary
    key): the rows of the range, and no other, whatever lies around them; a dead letter
    that failed again after it was created is found by its last failure."""
    day = 86_400_000
    base = 1_767_225_600_000  # 2026-01-01 00:00 UTC
    made = {}
    for n in range(40):  # one message a day from 2026-01-01, some gaps in the offsets
        row = QueueMessage.objects.create(topic="t", partition_key=f"k{n % 3}", id=f"m{n}",
                                          payload=b"{}", created_at=base + n * day + 1000,
                                          published_at=1)
        made[n] = row.offset
        if n % 7 == 3:
            row.delete()
            made.pop(n)
    page = admin_client.get(f"{A}/queuemessage/?created_at__range__gte=2026-01-10"
                            "&created_at__range__lte=2026-01-12").content.decode()
    shown = {n for n, offset in made.items() if f"/queuemessage/{offset}/change/" in page}
    assert shown == {9, 11}  # the 10th (n=9), 11th (n=10, deleted) and 12th of January
    dead = QueueMessage.objects.create(  # created on Feb 9th, failed again on Feb 15th
        topic="t_dlq", partition_key="k0", id="d0", payload=b"{}",
        created_at=base + 39 * day + 2000, published_at=1, consumer_group="g",
        original_topic="t", failed_at=base + 45 * day)
    QueueMessage.objects.create(topic="t", partition_key="k0", id="later", payload=b"{}",
                                created_at=base + 46 * day, published_at=1)

    def dead_listed(start: str, end: str) -> bool:
        page = admin_client.get(f"{A}/deadletter/?failed_at__range__gte={start}"
                                f"&failed_at__range__lte={end}").content.decode()
        return f"/deadletter/{dead.offset}/change/" in page

    assert dead_listed("2026-02-15", "2026-02-15")
    assert not dead_listed("2026-02-10", "2026-02-14")
    assert not dead_listed("2026-01-01", "2026-01-31")


@pytest.mark.django_db(transaction=True)
def test_the_dead_letter_filters_find_their_rows(admin_client: Client) -> None:
    """The original-topic filter reads the dead-letter topic (``<topic><DLQ_SUFFIX>``);
    the group filter lists the groups with a position and finds that group's only."""
    def dead(topic: str, group: str, n: int) -> int:
        return QueueMessage.objects.create(
            topic=f"{topic}_dlq", partition_key="k", id=f"d{n}", payload=b"{}", created_at=1,
            published_at=1, consumer_group=group, original_topic=topic, failure_count=1,
            last_error="ValueError: no").offset

    a, b, c = dead("orders", "g1", 1), dead("orders", "g2", 2), dead("refunds", "g1", 3)
    PartitionOffset.objects.bulk_create([
        PartitionOffset(consumer_group=g, topic=t, partition_key="k", offset_acked=0,
                        updated_at=1) for g, t in (("g1", "orders"), ("g2", "orders"),
                                                   ("g1", "refunds"))])

    def listed(query: str) -> set[int]:
        page = admin_client.get(f"{A}/deadletter/?{query}").content.decode()
        return {o for o in (a, b, c) if f"/deadletter/{o}/change/" in page}

    assert listed("") == {a, b, c}
    assert listed("original_topic=orders") == {a, b}
    assert listed("original_topic=refunds") == {c}
    assert listed("consumer_group=g1") == {a, c}
    assert listed("consumer_group=g2&original_topic=orders") == {b}
    filters = admin_client.get(f"{A}/deadletter/").content.decode()
    assert "?consumer_group=g2" in filters and "?original_topic=refunds" in filters
