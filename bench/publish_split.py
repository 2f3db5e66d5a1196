"""Where a one-message publish's gap to its floor goes (issue 41), on MySQL/MariaDB or
PostgreSQL:

    .venv/bin/python -m bench.publish_split --url mysql://root@127.0.0.1:3306/sqlqueue_bench

Three ways in turns, blocks of 25, outside a transaction and then each in its own
``atomic()``: ``send_message``; the very statement it sends, replayed through Django's
cursor with a fresh id each time (the log's table and statement, none of sqlqueue's
Python: MariaDB's INSERT with its values inline, PostgreSQL's ``EXECUTE`` of the INSERT
prepared in the session, with its parameters); the floor's bare INSERT
(``bench.baseline``) through one kept cursor with the payload's JSON made once, and as
``bench.publish`` takes it (``floor_as_a_view``: a cursor and the JSON for each INSERT, as
a view would). The replay's share of the floor is what the table costs; the publish's
share of the replay is what the package's Python costs.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
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

        ways = interleaved({"publish": publish, "replay": replay, "floor": bare,
                            "floor_as_a_view": bare_as_a_view}, count)
    return {
        "per_s_and_cpu_us": {name: [way["per_s"], way["cpu_us"]] for name, way in ways.items()},
        "publish_of_floor": ratio(ways["publish"], ways["floor"]),
        "replay_of_floor": ratio(ways["replay"], ways["floor"]),
        "publish_of_replay": ratio(ways["publish"], ways["replay"]),
        "publish_of_floor_as_a_view": ratio(ways["publish"], ways["floor_as_a_view"]),
        "replay_of_floor_as_a_view": ratio(ways["replay"], ways["floor_as_a_view"]),
    }


if __name__ == "__main__":
    main()
