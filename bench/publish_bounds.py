"""How close to its floor a one-message publish could get on MySQL/MariaDB (issue 41):

    .venv/bin/python -m bench.publish_bounds --url mysql://root@127.0.0.1:3306/sqlqueue_bench

Two stand-ins for ``send_message`` that are never to be used to publish, measured beside
it and beside ``bench.publish``'s floor (a bare INSERT of the same payload's JSON through
a cursor of its own, as a view would), blocks of 25 in turns, outside a transaction and
in ``atomic()``:

* ``checks_inline``: every check ``send_message`` makes for a message without an id,
  metadata or schedule (the topic and key, the payload's size and depth, the trace
  context, the route, the connection's character set, the packet size, the health check
  and query logging, the wake-up lookup), written out in one function;
* ``no_checks``: the same INSERT with only the JSON, the id and the escaping: what is
  left when nothing is checked.

The first tells what flattening the package's layers could still win; the difference
between the two, what the checks themselves cost.
"""

from __future__ import annotations

import argparse
import json
import time
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

    if connection.vendor != "mysql":
        raise SystemExit("MySQL/MariaDB only: the stand-ins write its inline INSERT")
    reset()
    payload = {"seq": 1, "t": time.time(), "run": "abcdef012345"}
    send_message("bench", payload, partition_key="k")  # the kept cursor and the text
    print(json.dumps({mode: _bounds(payload, args.count, atomic=mode == "atomic")
                      for mode in ("autocommit", "atomic")}, indent=2))


def _checks_inline(topic: str, payload: Any, partition_key: str) -> int:
    from django.db import connections

    from sqlqueue import tracing, wakeups
    from sqlqueue.conf import get_settings
    from sqlqueue.publishing.api import _check_fits
    from sqlqueue.publishing.messages import _PAYLOAD_ENCODER, new_message_id, now_ms
    from sqlqueue.storage import store
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
    dialect: Any = store(connection)
    dialect.check_connection()
    _check_fits(dialect, row)
    connection.close_if_health_check_failed()
    if (connection.queries_logged or connection.connection is not dialect._kept_for
            or dialect._kept_by != get_ident()):
        raise ValueError("not the kept cursor's case")
    escape = connection.connection.string_literal
    cursor = dialect._kept_cursor
    cursor.execute(dialect._one_message_text % (
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
    dialect = connection._sqlqueue_dialect
    escape = connection.connection.string_literal
    cursor = dialect._kept_cursor
    cursor.execute(dialect._one_message_text % (
        escape(topic.encode()), escape(partition_key.encode()),
        b"'%s'" % new_message_id().encode(), escape(_PAYLOAD_ENCODER.encode(payload).encode()),
        b"NULL", b"%d" % now_ms(), b"50", b"0"))
    return int(cursor.lastrowid)


def _bounds(payload: Any, count: int, *, atomic: bool) -> dict[str, Any]:
    from django.db import connection, transaction

    from bench.baseline import FloorTable, interleaved, ratio
    from sqlqueue import send_message

    block = (lambda: transaction.atomic()) if atomic else nullcontext

    def way(publish: Callable[..., Any]) -> Callable[[int, int], None]:
        def run(first: int, count: int) -> None:
            for i in range(first, first + count):
                with block():
                    publish("bench", payload, partition_key=f"p{i % 16}")
        return run

    with FloorTable() as floor:
        def floor_as_a_view(first: int, count: int) -> None:
            for i in range(first, first + count):
                with block(), connection.cursor() as own:
                    own.execute(floor.insert_sql, [f"p{i % 16}", json.dumps(payload)])

        ways = interleaved({"send_message": way(send_message),
                            "checks_inline": way(_checks_inline),
                            "no_checks": way(_no_checks),
                            "floor_as_a_view": floor_as_a_view}, count)
    return {name: {"per_s": result["per_s"], "cpu_us": result["cpu_us"],
                   "of_floor": ratio(result, ways["floor_as_a_view"])}
            for name, result in ways.items()}


if __name__ == "__main__":
    main()
