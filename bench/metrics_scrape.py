"""How long a Prometheus scrape of the queue-state metrics takes on a big queue (issue 16:
"a scrape of 1M messages over 1,000 partitions and 20 groups stays under 1 s").

    python -m bench.metrics_scrape                    # MariaDB, database sqlqueue_bench
    python -m bench.metrics_scrape --url mysql://root@127.0.0.1:3306/mydb --runs 7
    python -m bench.metrics_scrape --messages 100000 --partitions 100 --groups 5

Loads ``--messages`` rows over ``--partitions`` partitions of one topic (MariaDB: one
INSERT ... SELECT from the SEQUENCE engine), then ``--groups`` consumer groups. The first
``--lagging-groups`` (default: all) lag on every partition, group n having consumed
n/groups of it (group 0 nothing): every partition of every such group is probed and
counted up to the lag service's cap, the worst case. The other groups have consumed
everything (a healthy group costs no probe). Each group has every partition leased by
one of 10 live subscribers, 10 messages in flight and 2 retrying on each of its first 100
partitions, and 50 dead letters.

Then scrapes ``/queue/metrics/`` with a bearer token through the Django test client
``--runs`` times and prints the median and worst wall time (rendering included) and the
number of SQL statements of one scrape, as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from typing import Any

from bench.common import bulk_load, reset, setup

TOPIC = "bench.metrics"
SUBSCRIBERS = 10
TOKEN = "bench-token"


def shape_groups(groups: int, lagging: int, hints: bool = True) -> None:
    from django.db import connection

    from sqlqueue.models import (
        DeliveryState,
        PartitionLease,
        PartitionOffset,
        QueueMessage,
        SubscriberHeartbeat,
    )
    from sqlqueue.storage.sql import store_for

    with connection.cursor() as cursor:
        now = store_for(connection).database_now_ms(cursor)
    by_partition: dict[str, list[int]] = defaultdict(list)
    for key, offset in (QueueMessage.objects.filter(topic=TOPIC).order_by("offset")
                        .values_list("partition_key", "offset").iterator(chunk_size=20_000)):
        by_partition[key].append(offset)
    keys = sorted(by_partition)
    for g in range(groups):
        group = f"bench-g{g:02}"
        offsets, leases, states = [], [], []
        for index, key in enumerate(keys):
            stored = by_partition[key]
            # The first ``lagging`` groups lag (group 0 has consumed nothing); the others
            # have consumed everything stored (nothing to probe: a healthy group).
            consumed = len(stored) * g // groups if g < lagging else len(stored)
            watermark = stored[consumed - 1] if consumed else 0
            # A runconsumer that moved the watermark records the next message as the
            # first pending one (queue_offsets.first_pending); --without-hints: none did
            # (the group never ran, or a Spark stream consumed it).
            hint = stored[consumed] if hints and consumed < len(stored) else None
            offsets.append(PartitionOffset(consumer_group=group, topic=TOPIC,
                                           partition_key=key, offset_acked=watermark,
                                           updated_at=now - 1000, first_pending=hint))
            leases.append(PartitionLease(consumer_group=group, topic=TOPIC, partition_key=key,
                                         leased_by=f"{group}-w{index % SUBSCRIBERS}",
                                         leased_at=now, lease_renewed_at=now, generation=1))
            if index < 100:
                for n, offset in enumerate(stored[consumed:consumed + 12]):
                    retrying = n >= 10
                    states.append(DeliveryState(
                        consumer_group=group, topic=TOPIC, partition_key=key,
                        message_offset=offset, acked=False, invisible_until=now + 30_000,
                        retry_count=1 if retrying else 0,
                        last_error="boom" if retrying else ""))
        PartitionOffset.objects.bulk_create(offsets, batch_size=1000)
        PartitionLease.objects.bulk_create(leases, batch_size=1000)
        DeliveryState.objects.bulk_create(states, batch_size=1000)
        SubscriberHeartbeat.objects.bulk_create([
            SubscriberHeartbeat(consumer_group=group, topic=TOPIC,
                                subscriber_name=f"{group}-w{n}", heartbeat_at=now)
            for n in range(SUBSCRIBERS)])
        QueueMessage.objects.bulk_create([
            QueueMessage(topic=TOPIC + "_dlq", partition_key=keys[n % len(keys)],
                         id=f"m{n}@{group}", payload=b"{}", created_at=now, published_at=now,
                         failed_at=now, failure_count=5, last_error="boom",
                         original_topic=TOPIC, consumer_group=group)
            for n in range(50)], batch_size=500)
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            for table in ("queue_messages", "queue_offsets", "queue_delivery_state",
                          "queue_partition_leases", "queue_subscriber_heartbeats"):
                cursor.execute(f"ANALYZE TABLE {table}")
                cursor.fetchall()


def time_scrapes(runs: int) -> dict[str, Any]:
    from django.db import connection, reset_queries
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, override_settings

    client = Client()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    timings = []
    with override_settings(SQLQUEUE={"METRICS_TOKEN": TOKEN}):
        for _ in range(runs):
            started = time.perf_counter()
            response = client.get("/queue/metrics/", headers=headers)
            timings.append(time.perf_counter() - started)
            assert response.status_code == 200, response.status_code
        reset_queries()
        with CaptureQueriesContext(connection) as queries:
            client.get("/queue/metrics/", headers=headers)
    body = response.content.decode()
    return {"median_s": round(statistics.median(timings), 3),
            "worst_s": round(max(timings), 3), "statements": len(queries),
            "bytes": len(body),
            "series": sum(1 for line in body.splitlines() if not line.startswith("#"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="mysql://root@127.0.0.1:3306/sqlqueue_bench")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--lagging-groups", type=int, default=20,
                        help="How many of the groups lag on every partition (default 20: "
                             "all, the worst case); the others have consumed everything.")
    parser.add_argument("--without-hints", action="store_true",
                        help="No group has a runconsumer's hint of its first pending "
                             "message: every lagging partition is probed.")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--reuse", action="store_true",
                        help="Scrape the data a previous run loaded (no reload).")
    args = parser.parse_args()
    setup(args.url)
    import django
    from django.db import connection

    started = time.perf_counter()
    if not args.reuse:
        reset()
        bulk_load(TOPIC, args.messages, args.partitions)
        shape_groups(args.groups, min(args.lagging_groups, args.groups),
                     hints=not args.without_hints)
    loaded = time.perf_counter() - started
    version = ".".join(map(str, connection.mysql_version)) if connection.vendor == "mysql" \
        else ""
    print(json.dumps({
        "database": f"{connection.vendor} {version}".strip(),
        "django": django.get_version(),
        "messages": args.messages, "partitions": args.partitions, "groups": args.groups,
        "lagging_groups": min(args.lagging_groups, args.groups),
        "hints": None if args.reuse else not args.without_hints,
        "load_s": round(loaded, 1),
        "scrape": time_scrapes(args.runs),
    }, indent=2))


if __name__ == "__main__":
    main()
