"""No-op consumers the drain benchmark runs (registered when the bench app is installed)."""

from __future__ import annotations

import sqlqueue

TOPIC = "bench.drain"


@sqlqueue.consumer(TOPIC, group="bench-unordered")
def unordered(message: sqlqueue.Message) -> None:
    return None


@sqlqueue.consumer(TOPIC, group="bench-ordered", ordered=True)
def ordered(message: sqlqueue.Message) -> None:
    return None


@sqlqueue.consumer("bench.soak", group="soak")
def soak(message: sqlqueue.Message) -> None:
    """Journal every delivery, so the soak report can count losses and duplicates."""
    import os

    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO soak_journal (message_offset, pid) VALUES (%s, %s)",
                       [message.offset, os.getpid()])
