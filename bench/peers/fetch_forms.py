#!/usr/bin/env python
"""A poll after one new message among 16 partitions, in its two forms (issue 41), timed
in turns in one process on the peers' database (DB_URL): ``fetch_partitions`` of all 16
(MySQL's poll before issue 41) against ``partitions_with_rows`` and then the one
partition's fetch (``narrows_fetches``). Prints each form's median and p95 in ms.

    BENCH_PEER=sqlqueue DB_URL=mysql://... python fetch_forms.py [rounds]
"""
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchproj.settings")
os.environ.setdefault("BENCH_PEER", "sqlqueue")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402

from adapters.sqlqueue import GROUP, PARTITIONS, TOPIC, SqlQueueAdapter  # noqa: E402
from sqlqueue import OutgoingMessage, send_messages  # noqa: E402
from sqlqueue import storage  # noqa: E402


def main(rounds):
    adapter = SqlQueueAdapter()
    adapter.reset()
    sent = send_messages(TOPIC, [OutgoingMessage({"n": n}, partition_key=f"p{n % PARTITIONS}")
                                 for n in range(50 * PARTITIONS)])
    last = {}
    for message in sent:
        last[message.partition_key] = max(last.get(message.partition_key, 0), message.offset)
    new = send_messages(TOPIC, [OutgoingMessage({"n": -1}, partition_key="p3")])[0]
    store = storage.store(connection)
    head = new.offset
    everything = sorted(last.items())
    timings = {"fetch 16": [], "ask, then fetch 1": []}
    with connection.cursor() as cursor:
        for _ in range(rounds):
            t0 = time.perf_counter()
            store.fetch_partitions(cursor, GROUP, TOPIC, everything, 100)
            t1 = time.perf_counter()
            with_rows = store.partitions_with_rows(cursor, TOPIC, head - 1, head)
            store.fetch_partitions(cursor, GROUP, TOPIC,
                                     [(k, last[k]) for k in sorted(with_rows)], 100)
            t2 = time.perf_counter()
            timings["fetch 16"].append((t1 - t0) * 1e3)
            timings["ask, then fetch 1"].append((t2 - t1) * 1e3)
    adapter.reset()
    for name, values in timings.items():
        values.sort()
        print(f"{connection.vendor}: {name:18s} median {statistics.median(values):.2f} ms, "
              f"p95 {values[int(len(values) * 0.95)]:.2f} ms ({rounds} rounds in turns)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 500)
