"""What every benchmark does first: point Django at the benchmark database, migrate, and
empty the queue tables."""

from __future__ import annotations

import os

QUEUE_TABLES = ("queue_messages", "queue_delivery_state", "queue_offsets",
                "queue_partition_leases", "queue_subscriber_heartbeats",
                "queue_idempotency_keys")


def setup(url: str) -> None:
    os.environ["BENCH_DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"  # not an inherited one
    from bench.publish import ensure_database

    ensure_database(url)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import DatabaseError, connection

    try:
        call_command("migrate", verbosity=0)
    except DatabaseError:
        # Migrated by another version of sqlqueue (a branch's migrations, numbered
        # otherwise): the benchmark database is scratch space, so start it afresh.
        if connection.vendor not in ("mysql", "postgresql"):
            raise
        connection.close()
        ensure_database(url, afresh=True)
        call_command("migrate", verbosity=0)


def reset() -> None:
    """Empty the queue tables. TRUNCATE on MySQL/MariaDB and PostgreSQL: after a DELETE
    of a million rows, InnoDB's purge lags (PostgreSQL's dead tuples wait for vacuum) and
    every index scan steps over deleted entries for a while, which would be measured as
    our cost."""
    from django.db import connection

    empty = "DELETE FROM" if connection.vendor == "sqlite" else "TRUNCATE TABLE"
    with connection.cursor() as cursor:
        for table in QUEUE_TABLES:
            cursor.execute(f"{empty} {connection.ops.quote_name(table)}")


def bulk_load(topic: str, messages: int, partitions: int) -> None:
    """``messages`` rows of ``topic`` over ``partitions`` keys p0000.., created over the
    last hour, oldest first. MariaDB: one INSERT ... SELECT from the SEQUENCE engine
    (seconds for a million rows); elsewhere: send_messages in batches."""
    from django.db import connection

    if connection.vendor == "mysql":
        now = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000)"
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO queue_messages (topic, partition_key, id, payload, created_at, "
                "published_at, priority, deliver_after) "
                f"SELECT %s, CONCAT('p', LPAD(seq MOD %s, 4, '0')), CONCAT('m', seq), "
                f"'{{}}', {now} - 3600000 + seq * 3600000 DIV %s, {now}, 50, 0 "
                f"FROM seq_1_to_{int(messages)} ORDER BY seq",
                [topic, partitions, messages],
            )
        return
    from sqlqueue import OutgoingMessage, send_messages

    for start in range(0, messages, 1000):
        send_messages(topic, [OutgoingMessage({}, partition_key=f"p{n % partitions:04}")
                              for n in range(start, min(start + 1000, messages))])
