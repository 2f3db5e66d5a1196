"""How fast the admin's lag pages render on a big queue (issue: "well under a second with
1M messages and 1,000 partitions").

    python -m bench.lag_page                      # MariaDB, database sqlqueue_bench
    python -m bench.lag_page --messages 100000 --partitions 100

Loads ``--messages`` rows over ``--partitions`` partitions of one topic (MariaDB: one
INSERT ... SELECT from the SEQUENCE engine; SQLite: send_messages), then sets up two
consumer groups as an operator would find them:

* ``bench-busy``: 90 % consumed, every partition leased by one of 10 live subscribers,
  10 messages in flight and 2 retrying per partition, 500 dead letters;
* ``bench-new``: registered on every partition but has consumed nothing (every message
  pending: the worst case for counting, capped by the count budget).

Then renders, with a logged-in superuser and the Django test client, the lag overview,
each group's page and the subscribers page, ``--runs`` times each, and prints the
median and worst wall time (rendering included) as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from bench.common import bulk_load, reset, setup

TOPIC = "bench.lag"
SUBSCRIBERS = 10


def shape_groups(partitions: int) -> None:
    """Watermarks, leases, heartbeats, delivery states and dead letters of two groups."""
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
        heads = store_for(connection).partition_heads(cursor, TOPIC)
    offsets, leases, states = [], [], []
    for index, key in enumerate(sorted(heads)):
        in_partition = QueueMessage.objects.filter(topic=TOPIC, partition_key=key)
        count = in_partition.count()
        watermark = (in_partition.order_by("offset")
                     .values_list("offset", flat=True)[int(count * 0.9) - 1])
        offsets.append(PartitionOffset(consumer_group="bench-busy", topic=TOPIC,
                                       partition_key=key, offset_acked=watermark,
                                       updated_at=now - 1000))
        offsets.append(PartitionOffset(consumer_group="bench-new", topic=TOPIC,
                                       partition_key=key, offset_acked=0, updated_at=now))
        leases.append(PartitionLease(consumer_group="bench-busy", topic=TOPIC,
                                     partition_key=key, leased_by=f"worker-{index % SUBSCRIBERS}",
                                     leased_at=now, lease_renewed_at=now, generation=1))
        above = list(in_partition.filter(offset__gt=watermark).order_by("offset")
                     .values_list("offset", flat=True)[:12])
        for n, offset in enumerate(above):
            retrying = n >= 10
            states.append(DeliveryState(
                consumer_group="bench-busy", topic=TOPIC, partition_key=key,
                message_offset=offset, acked=False, invisible_until=now + 30_000,
                retry_count=1 if retrying else 0, last_error="boom" if retrying else ""))
    PartitionOffset.objects.bulk_create(offsets, batch_size=1000)
    PartitionLease.objects.bulk_create(leases, batch_size=1000)
    DeliveryState.objects.bulk_create(states, batch_size=1000)
    SubscriberHeartbeat.objects.bulk_create([
        SubscriberHeartbeat(consumer_group="bench-busy", topic=TOPIC,
                            subscriber_name=f"worker-{n}", heartbeat_at=now)
        for n in range(SUBSCRIBERS)])
    QueueMessage.objects.bulk_create([
        QueueMessage(topic=TOPIC + ".dlq", partition_key=f"p{n % partitions:04}",
                     id=f"m{n}@bench-busy", payload=b"{}", created_at=now, published_at=now,
                     failed_at=now, failure_count=5, last_error="boom", original_topic=TOPIC,
                     consumer_group="bench-busy")
        for n in range(500)], batch_size=500)
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            for table in ("queue_messages", "queue_offsets", "queue_delivery_state"):
                cursor.execute(f"ANALYZE TABLE {table}")
                cursor.fetchall()


def time_pages(runs: int) -> dict[str, Any]:
    from django.contrib.auth.models import User
    from django.test import Client
    from django.urls import reverse
    from django.utils.http import urlencode

    user, _ = User.objects.get_or_create(username="bench", defaults={"is_staff": True,
                                                                     "is_superuser": True})
    client = Client()
    client.force_login(user)
    subscription = reverse("admin:sqlqueue_consumerlag_subscription")
    pages = {
        "overview": reverse("admin:sqlqueue_consumerlag_changelist"),
        "group 90% consumed": subscription + "?" + urlencode(
            {"group": "bench-busy", "topic": TOPIC}),
        "group with everything pending": subscription + "?" + urlencode(
            {"group": "bench-new", "topic": TOPIC}),
        "subscribers and leases": reverse("admin:sqlqueue_subscriberstatus_changelist"),
    }
    results = {}
    for name, url in pages.items():
        timings = []
        for _ in range(runs):
            started = time.perf_counter()
            response = client.get(url)
            timings.append(time.perf_counter() - started)
            assert response.status_code == 200, (url, response.status_code)
        results[name] = {"median_s": round(statistics.median(timings), 3),
                         "worst_s": round(max(timings), 3), "bytes": len(response.content)}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="mysql://root@127.0.0.1:3306/sqlqueue_bench")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    setup(args.url)
    import django
    from django.db import connection

    reset()
    started = time.perf_counter()
    bulk_load(TOPIC, args.messages, args.partitions)
    shape_groups(args.partitions)
    loaded = time.perf_counter() - started
    print(json.dumps({
        "database": f"{connection.vendor} {'.'.join(map(str, connection.mysql_version)) if connection.vendor == 'mysql' else ''}".strip(),  # noqa: E501
        "django": django.get_version(),
        "messages": args.messages, "partitions": args.partitions,
        "load_s": round(loaded, 1),
        "pages": time_pages(args.runs),
    }, indent=2))


if __name__ == "__main__":
    main()
