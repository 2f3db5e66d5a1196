"""Where a one-message publish's gap to its floor goes (issue 41), on MySQL/MariaDB:

    .venv/bin/python -m bench.publish_split --url mysql://root@127.0.0.1:3306/sqlqueue_bench

Three ways in turns, blocks of 25, in autocommit: ``send_message``; the very INSERT it
sends, replayed through Django's cursor with a fresh id each time (the log's table and
statement, none of sqlqueue's Python); the floor's bare INSERT (``bench.baseline``). The
replay's share of the floor is what the table costs; the publish's share of the replay is
what the package's Python costs. (PostgreSQL's INSERT takes parameters: not replayed.)
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="mysql://root@127.0.0.1:3306/sqlqueue_bench")
    parser.add_argument("--count", type=int, default=3000)
    args = parser.parse_args()
    from bench.common import reset, setup

    setup(args.url)
    from django.db import connection

    from bench.baseline import FloorTable, interleaved, ratio
    from sqlqueue import send_message

    reset()
    payload = {"seq": 1, "t": time.time(), "run": "abcdef012345"}
    sent_sql: list[Any] = []

    def capture(execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        sent_sql.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        sent = send_message("bench", payload, partition_key="k")
    text = sent_sql[-1].decode() if isinstance(sent_sql[-1], bytes) else sent_sql[-1]
    if sent.id not in text:
        raise SystemExit(f"{connection.vendor}: the INSERT carries no literal id to replay")
    body = json.dumps(payload)
    with FloorTable() as floor, connection.cursor() as cursor:
        def publish(first: int, count: int) -> None:
            for i in range(first, first + count):
                send_message("bench", payload, partition_key=f"p{i % 16}")

        def replay(first: int, count: int) -> None:
            for _ in range(count):
                cursor.execute(text.replace(sent.id, uuid.uuid4().hex))

        def bare(first: int, count: int) -> None:
            for i in range(first, first + count):
                cursor.execute(floor.insert_sql, [f"p{i % 16}", body])

        ways = interleaved({"publish": publish, "replay": replay, "floor": bare}, args.count)
    print(json.dumps({
        "per_s_and_cpu_us": {name: [way["per_s"], way["cpu_us"]] for name, way in ways.items()},
        "publish_of_floor": ratio(ways["publish"], ways["floor"]),
        "replay_of_floor": ratio(ways["replay"], ways["floor"]),
        "publish_of_replay": ratio(ways["publish"], ways["replay"]),
    }, indent=2))


if __name__ == "__main__":
    main()
