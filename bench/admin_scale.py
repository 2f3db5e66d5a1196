"""Every operator page on a log of millions (issue 52): seconds per admin page, `queue
status`, `queue health` and `/queue/metrics/`, through Django's test client as a superuser.

    python -m bench.admin_scale --url mysql://root@127.0.0.1:3306/h52a_big --load
    python -m bench.admin_scale --url postgres://postgres@127.0.0.1:5432/h52a_big --load \
        --messages 1000000
    python -m bench.admin_scale --url mysql://root@127.0.0.1:3306/h52a_big   # measure again

``--load`` empties the queue tables and writes, as an operator would find them after a
night with a consumer down:

* ``--messages`` messages (2,000,000) on ``scale.backlog`` over ``--partitions`` (64)
  partition keys, that the registered group ``scale-idle`` has not consumed (position 0);
* ``--dead-letters`` dead letters (100,000) of the group ``scale-reject`` from
  ``scale.rejects`` (in ``scale.rejects_dlq``, written after the backlog);
* 20,000 messages on ``scale.recent`` that the group ``scale-busy`` has consumed;
* ``--rare`` dead letters (100) of another group, ``scale-rare``, among those of
  ``scale-reject`` (the consumer-group filter must not read the others);
* ``--topics`` small topics (1,500) ``scale.many.NNNN`` of 4 messages each, every third
  with a dead letter: more topics than any list shows; nobody consumes them, unless
  ``--subscribe-topics`` gives the group ``scale-many`` a position on each (1,500
  subscriptions: the lag overview, metrics and status then read each one).

The rows are written set-based (MariaDB: ``INSERT ... SELECT`` from the SEQUENCE engine;
PostgreSQL: from ``generate_series``; SQLite: ``send_messages``) with the columns and the
payload size (~100 bytes of JSON) that ``send_messages`` writes: seconds instead of minutes
for two million rows on a shared machine, and the pages read the same rows either way.

Each page is fetched ``--runs`` times (default 2: the first with a cold-ish buffer pool,
the second warm); the table gives each run's seconds and the HTTP status. Timings are wall
times on whatever machine runs them: indications, not assertions (the tests assert plans
and statements, tests/integration/test_admin_scale.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.common import reset, setup

BACKLOG = "scale.backlog"
REJECTS = "scale.rejects"
RECENT = "scale.recent"
MANY = "scale.many."
PAD = "x" * 80


def load(messages: int, dead_letters: int, partitions: int, recent: int = 20_000,
         dead_letters_first: bool = False, rare: int = 100, topics: int = 1_500,
         subscribe_topics: bool = False) -> None:
    from django.db import connection

    from sqlqueue.models import PartitionOffset
    from sqlqueue.storage.sql import store_for

    reset()
    if dead_letters_first:  # a failure storm, then the backlog: the dead letters are old
        _insert(REJECTS + "_dlq", dead_letters, partitions, dead_of=(REJECTS, "scale-reject"))
    _insert(BACKLOG, messages, partitions)
    if not dead_letters_first:
        _insert(REJECTS + "_dlq", dead_letters, partitions, dead_of=(REJECTS, "scale-reject"))
    _insert(RECENT, recent, partitions)
    if rare:
        _insert(REJECTS + "_dlq", rare, partitions, dead_of=(REJECTS, "scale-rare"),
                first=dead_letters)
    for n in range(topics):
        _insert(f"{MANY}{n:04}", 4, 1)
        if n % 3 == 0:
            _insert(f"{MANY}{n:04}_dlq", 1, 1, dead_of=(f"{MANY}{n:04}", "scale-many"))
    with connection.cursor() as cursor:
        now = store_for(connection).database_now_ms(cursor)
        heads = store_for(connection).partition_heads(cursor, RECENT)
    keys = [f"k{n}" for n in range(partitions)]
    PartitionOffset.objects.bulk_create(
        [PartitionOffset(consumer_group="scale-idle", topic=BACKLOG, partition_key=key,
                         offset_acked=0, updated_at=now) for key in keys]
        + [PartitionOffset(consumer_group="scale-reject", topic=REJECTS, partition_key=key,
                           offset_acked=0, updated_at=now) for key in keys]
        + [PartitionOffset(consumer_group="scale-busy", topic=RECENT, partition_key=key,
                           offset_acked=head, updated_at=now) for key, head in heads.items()]
        + [PartitionOffset(consumer_group="scale-many", topic=f"{MANY}{n:04}",
                           partition_key="k0", offset_acked=0, updated_at=now)
           for n in range(topics if subscribe_topics else 0)]
        + [PartitionOffset(consumer_group="scale-rare", topic=REJECTS, partition_key="k0",
                           offset_acked=0, updated_at=now)],
        batch_size=1000)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE queue_messages")
    elif connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE TABLE queue_messages")
            cursor.fetchall()


def _insert(topic: str, count: int, partitions: int,
            dead_of: tuple[str, str] | None = None, first: int = 0) -> None:
    """``count`` rows of ``topic`` (dead letters of ``dead_of`` = (topic, group) if given),
    in chunks of 500,000 so that no transaction is huge."""
    from django.db import connection

    chunk = 500_000
    for start in range(first, first + count, chunk):
        n = min(chunk, first + count - start)
        if connection.vendor == "sqlite":
            _send(topic, start, n, partitions, dead_of)
            continue
        with connection.cursor() as cursor:
            cursor.execute(*_insert_select(connection.vendor, topic, start, n, partitions,
                                           dead_of))


def _insert_select(vendor: str, topic: str, start: int, n: int, partitions: int,
                   dead_of: tuple[str, str] | None) -> tuple[str, list[Any]]:
    if vendor == "mysql":
        now = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000)"
        seq = f"(seq + {start})"
        source = f"FROM seq_1_to_{n} ORDER BY seq"
        concat = lambda *parts: f"CONCAT({', '.join(parts)})"  # noqa: E731
    else:
        now = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint"
        seq = f"(seq + {start})"
        source = f"FROM generate_series(1, {n}) AS seq ORDER BY seq"
        concat = lambda *parts: "(" + " || ".join(parts) + ")"  # noqa: E731
    payload = concat("'{\"i\": '", f"{seq}", f"', \"pad\": \"{PAD}\"}}'")
    if vendor != "mysql":
        payload = f"convert_to({payload}, 'UTF8')"
    modulo = "MOD" if vendor == "mysql" else "%%"
    key = concat("'k'", f"{seq} {modulo} {partitions}")
    columns = ["topic", "partition_key", "id", "payload", "created_at", "published_at",
               "priority", "deliver_after"]
    values = [f"{key}", concat("'m'", seq), payload, f"{now} - 86400000 + {seq}",
              f"{now} - 86400000 + {seq}", "50", "0"]
    params: list[Any] = [topic]
    if dead_of:
        columns += ["consumer_group", "original_topic", "failed_at", "failure_count",
                    "last_error"]
        values += ["%s", "%s", now, "3",
                   concat("'Traceback (most recent call last):\\n  ...\\nValueError: rejected '",
                          seq)]
        params += [dead_of[1], dead_of[0]]
    return (f"INSERT INTO queue_messages ({', '.join(columns)}) "
            f"SELECT %s, {', '.join(values)} {source}", params)


def _send(topic: str, start: int, n: int, partitions: int,
          dead_of: tuple[str, str] | None) -> None:
    from sqlqueue import OutgoingMessage, send_messages
    from sqlqueue.models import QueueMessage

    for first in range(start, start + n, 1000):
        numbers = range(first, min(first + 1000, start + n))
        send_messages(topic, [OutgoingMessage({"i": i, "pad": PAD},
                                              partition_key=f"k{i % partitions}", id=f"m{i}")
                              for i in numbers])
    if dead_of:
        QueueMessage.objects.filter(topic=topic).update(
            consumer_group=dead_of[1], original_topic=dead_of[0], failure_count=3,
            failed_at=1, last_error="ValueError: rejected")


def pages() -> list[tuple[str, str]]:
    """(name, URL) of every operator page, each changelist plain, searched, filtered and
    paged deep."""
    from sqlqueue.models import DeadLetter, QueueMessage, TaskRecord

    newest = QueueMessage.objects.filter(topic=BACKLOG).order_by("-offset").first()
    dead = DeadLetter.objects.order_by("-offset").first()
    task = TaskRecord.objects.first()
    a = "/admin/sqlqueue"
    rows = [
        ("messages", f"{a}/queuemessage/"),
        ("messages, search key k7", f"{a}/queuemessage/?q=k7"),
        ("messages, search an id", f"{a}/queuemessage/?q=m12345"),
        ("messages, search an offset", f"{a}/queuemessage/?q={newest.offset if newest else 1}"),
        ("messages, search nothing found", f"{a}/queuemessage/?q=no-such-id"),
        ("messages, filter topic", f"{a}/queuemessage/?topic={BACKLOG}"),
        ("messages, filter small topic", f"{a}/queuemessage/?topic={RECENT}"),
        ("messages, filter created (nothing then)",
         f"{a}/queuemessage/?created_at__range__gte=2000-01-01&created_at__range__lte=2000-01-02"),
        ("messages, page 200", f"{a}/queuemessage/?p=199"),
        ("messages, page 100", f"{a}/queuemessage/?p=99"),
        ("messages, older than the middle offset",
         f"{a}/queuemessage/?offset__lt={newest.offset // 2 if newest else 1}"),
        ("message detail", f"{a}/queuemessage/{newest.offset if newest else 1}/change/"),
        ("dead letters", f"{a}/deadletter/"),
        ("dead letters, search key k7", f"{a}/deadletter/?q=k7"),
        ("dead letters, search nothing found", f"{a}/deadletter/?q=no-such-id"),
        ("dead letters, filter group", f"{a}/deadletter/?consumer_group=scale-reject"),
        ("dead letters, filter rare group", f"{a}/deadletter/?consumer_group=scale-rare"),
        ("dead letters, filter small topic",
         f"{a}/deadletter/?original_topic={MANY}0999"),
        ("messages, filter one of many topics", f"{a}/queuemessage/?topic={MANY}1499"),
        ("dead letters, filter topic", f"{a}/deadletter/?original_topic={REJECTS}"),
        ("dead letters, page 50", f"{a}/deadletter/?p=49"),
        ("dead letters, filter failed (nothing then)",
         f"{a}/deadletter/?failed_at__range__gte=2000-01-01&failed_at__range__lte=2000-01-02"),
        ("dead letter detail", f"{a}/deadletter/{dead.offset if dead else 1}/change/"),
        ("lag overview", f"{a}/consumerlag/"),
        ("lag of scale-idle",
         f"{a}/consumerlag/subscription/?group=scale-idle&topic={BACKLOG}"),
        ("live overview", f"{a}/liveoverview/"),
        ("subscribers", f"{a}/subscriberstatus/"),
        ("schedules", f"{a}/schedulestate/"),
        ("editable schedules", f"{a}/storedschedule/"),
        ("task results", f"{a}/taskrecord/"),
        ("/queue/metrics/", "/queue/metrics/"),
    ]
    if task is not None:
        rows.append(("task result detail", f"{a}/taskrecord/{task.pk}/change/"))
    return rows


def commands() -> list[tuple[str, Callable[[], Any]]]:
    from django.core.management import call_command

    def run(*args: str) -> Callable[[], Any]:
        def call() -> None:
            # health exits 1 when unhealthy: still measured
            with contextlib.suppress(SystemExit):
                call_command("queue", *args, stdout=io.StringIO(), stderr=io.StringIO())
        return call
    return [("queue status", run("status")), ("queue health", run("health"))]


def limit_statements(seconds: float) -> None:
    """Abort any statement of this connection after ``seconds`` (this session only), so a
    page that would take minutes is reported as "> seconds" instead of held for."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"SET SESSION max_statement_time = {float(seconds)}")
        elif connection.vendor == "postgresql":
            cursor.execute(f"SET statement_timeout = {int(seconds * 1000)}")


def _timed(call: Callable[[], Any], timeout: float | None) -> tuple[float | str, int]:
    from django.db import DatabaseError

    started = time.perf_counter()
    try:
        status = call()
    except DatabaseError:
        if timeout is None:
            raise
        return f"> {timeout:g}", 0
    return round(time.perf_counter() - started, 3), status if isinstance(status, int) else 0


def measure(runs: int, timeout: float | None = None, only: str = "",
            out: Callable[[dict[str, Any]], None] = lambda row: None) -> list[dict[str, Any]]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user_model = get_user_model()
    user = user_model.objects.filter(username="scale-admin").first() or \
        user_model.objects.create_superuser("scale-admin", "a@example.com", "x")
    client = Client()
    client.force_login(user)
    if timeout:
        limit_statements(timeout)
    results = []
    calls: list[tuple[str, str, Callable[[], Any]]] = [
        (name, url, lambda url=url: client.get(url).status_code) for name, url in pages()]
    calls += [(name, "", call) for name, call in commands()]
    for name, url, call in calls:
        if only and only not in name:
            continue
        seconds, status = [], 0
        for _ in range(runs):
            took, status = _timed(call, timeout)
            seconds.append(took)
        row = {"page": name, "url": url, "status": status, "seconds": seconds}
        out(row)
        results.append(row)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="mysql://root@127.0.0.1:3306/sqlqueue_bench_scale")
    parser.add_argument("--load", action="store_true", help="empty and fill the log first")
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--dead-letters", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--dead-letters-first", action="store_true",
                        help="write the dead letters before the backlog (old ones)")
    parser.add_argument("--rare", type=int, default=100,
                        help="dead letters of a second group among the others")
    parser.add_argument("--topics", type=int, default=1_500,
                        help="small topics besides the backlog (a long topic list)")
    parser.add_argument("--subscribe-topics", action="store_true",
                        help="a group consumes each of the --topics (1,500 subscriptions)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=None,
                        help="abort statements after this many seconds (reported as > N)")
    parser.add_argument("--only", default="", help="only the pages whose name has this")
    parser.add_argument("--json", action="store_true", help="print JSON, not a table")
    args = parser.parse_args()
    setup(args.url)
    if args.load:
        started = time.perf_counter()
        load(args.messages, args.dead_letters, args.partitions,
             dead_letters_first=args.dead_letters_first, rare=args.rare, topics=args.topics,
             subscribe_topics=args.subscribe_topics)
        print(f"loaded in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(measure(args.runs, args.timeout, args.only), indent=2))
        return
    width = 40
    print(f"{'page':<{width}}  status  " + "  ".join(f"run {n + 1:>2}" for n in range(args.runs)),
          flush=True)

    def show(r: dict[str, Any]) -> None:
        cells = (f"{s:>6.2f}" if isinstance(s, float) else f"{s:>6}" for s in r["seconds"])
        print(f"{r['page']:<{width}}  {r['status'] or '':>6}  " + "  ".join(cells), flush=True)
    measure(args.runs, args.timeout, args.only, show)


if __name__ == "__main__":
    main()
