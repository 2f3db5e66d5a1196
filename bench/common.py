"""What every benchmark does first: point Django at the benchmark database, migrate, and
empty the queue tables."""

from __future__ import annotations

import os

QUEUE_TABLES = ("queue_messages", "queue_delivery_state", "queue_offsets",
                "queue_partition_leases", "queue_subscriber_heartbeats")


def setup(url: str) -> None:
    os.environ["BENCH_DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    from bench.publish import ensure_database

    ensure_database(url)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def reset() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for table in QUEUE_TABLES:
            cursor.execute(f"DELETE FROM {connection.ops.quote_name(table)}")
