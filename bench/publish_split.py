"""Where a one-message publish's gap to its floor goes (issue 41), on MySQL/MariaDB or
PostgreSQL:

    .venv/bin/python -m bench.publish_split --url mysql://root@127.0.0.1:3306/sqlqueue_bench

Ways in turns, blocks of 25, outside a transaction and then each in its own
``atomic()``: ``send_message``; the very statement it sends, replayed through Django's
cursor with a fresh id each time (the log's table and statement, none of sqlqueue's
Python: MariaDB's INSERT with its values inline, PostgreSQL's ``EXECUTE`` of the INSERT
prepared in the session, with its parameters); the floor's bare INSERT
(``bench.baseline``) through one kept cursor with the payload's JSON made once, and as
``bench.publish`` takes it (``floor_as_a_view``: a cursor and the JSON for each INSERT, as
a view would). The replay's share of the floor is what the table costs; the publish's
share of the replay is what the package's Python costs.

On MySQL/MariaDB, two stand-ins for ``send_message`` too (never to be used to publish):
``checks_inline``, every check it makes for a message without an id, metadata or
schedule (the topic and key, the payload's size and depth, the trace context, the route,
the connection's character set, the packet size, the health check and query logging, the
wake-up lookup) written out in one function; and ``no_checks``, the INSERT with only the
JSON, the id and the escaping. The first tells what flattening the package's layers could
still win; the difference between the two, what the checks themselves cost.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from threading import get_ident
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="mysql://root@127.0.0.1:3306/sqlqueue_bench")
    parser.add_argument("--count", type=int, default=3000)
    args = parser.parse_args()
    from bench.common import reset, setup

    setup(args.url)
    from django.db import connection

    from sqlqueue import send_message

    reset()
    payload = {"seq": 1, "t": time.time(), "run": "abcdef012345"}
    for _ in range(10):  # PostgreSQL prepares the INSERT after its fifth run
        send_message("bench", payload, partition_key="k")
    sent_sql: list[Any] = []

    def capture(execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        sent_sql.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        sent = send_message("bench", payload, partition_key="k")
    statement = _replayable(*sent_sql[-1], sent.id)
    print(json.dumps({mode: _split(payload, statement, args.count, atomic=mode == "atomic")
                      for mode in ("autocommit", "atomic")}, indent=2))


def _replayable(sql: Any, params: Any, message_id: str) -> Callable[[str], tuple[Any, Any]]:
    """The statement ``send_message`` sent, as a function of a new id: MariaDB's text
    with the id inline, or PostgreSQL's parameters with the id among them."""
    if params is None:
        text = sql.decode() if isinstance(sql, bytes) else sql
        if message_id not in text:
            raise SystemExit("the INSERT carries no literal id to replay")
        return lambda new_id: (text.replace(message_id, new_id), None)
    values = list(params)
    at = values.index(message_id)

    def with_id(new_id: str) -> tuple[Any, Any]:
        values[at] = new_id
        return sql, values

    return with_id


def _split(payload: Any, statement: Callable[[str], tuple[Any, Any]], count: int, *,
           atomic: bool) -> dict[str, Any]:
    from django.db import connection, transaction

    from bench.baseline import FloorTable, interleaved, ratio
    from sqlqueue import send_message

    body = json.dumps(payload)
    block = (lambda: transaction.atomic()) if atomic else nullcontext
    with FloorTable() as floor, connection.cursor() as cursor:
        def publish(first: int, count: int) -> None:
            for i in range(first, first + count):
                with block():
                    send_message("bench", payload, partition_key=f"p{i % 16}")

        def replay(first: int, count: int) -> None:
            for _ in range(count):
                with block():
                    cursor.execute(*statement(str(uuid.uuid4())))

        def bare(first: int, count: int) -> None:
            for i in range(first, first + count):
                with block():
                    cursor.execute(floor.insert_sql, [f"p{i % 16}", body])

        def bare_as_a_view(first: int, count: int) -> None:  # bench.publish's floor
            for i in range(first, first + count):
                with block(), connection.cursor() as own:
                    own.execute(floor.insert_sql, [f"p{i % 16}", json.dumps(payload)])

        def stand_in(publish: Callable[..., Any]) -> Callable[[int, int], None]:
            def run(first: int, count: int) -> None:
                for i in range(first, first + count):
                    with block():
                        publish("bench", payload, f"p{i % 16}")
            return run

        ways = {"publish": publish, "replay": replay, "floor": bare,
                "floor_as_a_view": bare_as_a_view}
        if connection.vendor == "mysql":
            ways |= {"checks_inline": stand_in(_checks_inline),
                     "no_checks": stand_in(_no_checks)}
        results = interleaved(ways, count)
    shares = {"publish_of_floor": ("publish", "floor"), "replay_of_floor": ("replay", "floor"),
              "publish_of_replay": ("publish", "replay")}
    shares |= {f"{name}_of_floor_as_a_view": (name, "floor_as_a_view")
               for name in ways if not name.startswith("floor")}
    return {"per_s_and_cpu_us": {name: [way["per_s"], way["cpu_us"]]
                                 for name, way in results.items()},
            **{share: ratio(results[ours], results[base])
               for share, (ours, base) in shares.items()}}


def _checks_inline(topic: str, payload: Any, partition_key: str) -> int:
    from django.db import connections

    from sqlqueue import storage, tracing, wakeups
    from sqlqueue.conf import get_settings
    from sqlqueue.publishing.inserts import check_fits
    from sqlqueue.publishing.messages import _PAYLOAD_ENCODER, new_message_id, now_ms
    from sqlqueue.storage.sql import MessageRow

    conf = get_settings()
    for name, limit in ((topic, conf.max_topic_bytes), (partition_key, 255)):
        if not (type(name) is str and name.isascii() and name.isprintable()
                and 0 < len(name) <= limit):
            raise ValueError(name)
    message_id = new_message_id()
    text = _PAYLOAD_ENCODER.encode(payload)
    data = text.encode()
    if text.count("[") + text.count("{") > 64 or len(data) > conf.MAX_PAYLOAD_BYTES:
        raise ValueError("payload")
    if tracing.inject(None) is not None:
        raise ValueError("a trace context: not this stand-in's case")
    row = MessageRow(topic=topic, partition_key=partition_key, id=message_id, payload=data,
                     metadata=None, published_at=now_ms(), priority=50, delay_ms=None,
                     deliver_at_ms=0, fresh_id=True)
    connection = connections[conf.alias_for(topic)]
    store: Any = storage.store(connection)
    store.check_connection()
    check_fits(store, row)
    connection.close_if_health_check_failed()
    if (connection.queries_logged or connection.connection is not store._kept_for
            or store._kept_by != get_ident()):
        raise ValueError("not the kept cursor's case")
    escape = connection.connection.string_literal
    cursor = store._kept_cursor
    cursor.execute(store.sql.store_messages([row])[0].encode() % (
        escape(topic.encode()), escape(partition_key.encode()), b"'%s'" % message_id.encode(),
        escape(data), b"NULL", b"%d" % row.published_at, b"50", b"0"))
    if conf.WAKEUPS and (conf.WAKEUP_REDIS_URL or wakeups.subscribed(topic)):
        raise ValueError("a wake-up to ring: not this stand-in's case")
    return int(cursor.lastrowid)


def _no_checks(topic: str, payload: Any, partition_key: str) -> int:
    from django.db import connections

    from sqlqueue.conf import get_settings
    from sqlqueue.publishing.messages import _PAYLOAD_ENCODER, new_message_id, now_ms

    connection: Any = connections[get_settings().DATABASE]
    store = connection._sqlqueue_kept_store
    escape = connection.connection.string_literal
    cursor = store._kept_cursor
    head, at_once, _ = store.sql._insert_parts
    cursor.execute((head + at_once).encode() % (
        escape(topic.encode()), escape(partition_key.encode()),
        b"'%s'" % new_message_id().encode(), escape(_PAYLOAD_ENCODER.encode(payload).encode()),
        b"NULL", b"%d" % now_ms(), b"50", b"0"))
    return int(cursor.lastrowid)


if __name__ == "__main__":
    main()
