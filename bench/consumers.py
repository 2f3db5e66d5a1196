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
    _journal(message, _database_now_ms())


@sqlqueue.consumer("bench.soak", group="soak-ordered", ordered=True)
def soak_ordered(message: sqlqueue.Message) -> None:
    """The same in offset order, taking a little time, so that the report can tell two
    runs in one partition that overlapped (SPEC I5)."""
    import time

    started_ms = _database_now_ms()
    time.sleep(0.005)
    _journal(message, started_ms)


def _database_now_ms() -> int:
    from django.db import connection

    from sqlqueue.storage.sql import dialect_for

    with connection.cursor() as cursor:
        return dialect_for(connection).database_now_ms(cursor)


def _journal(message: sqlqueue.Message, started_ms: int) -> None:
    """One row per handler run: which delivery, in which process, from when to when
    (database time)."""
    import os

    from django.db import connection

    from sqlqueue.storage.sql import dialect_for

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO soak_journal (grp, message_offset, partition_key, attempt, pid, "
            f"started_ms, finished_ms) VALUES (%s, %s, %s, %s, %s, %s, "
            f"{dialect_for(connection).now_ms_sql})",
            [message.consumer_group, message.offset, message.partition_key, message.attempt,
             os.getpid(), started_ms])


@sqlqueue.consumer("bench.rate", group="bench-rate",
                   rate_limit=float(__import__("os").environ.get("BENCH_RATE_LIMIT", "100")))
def rate_limited(message: sqlqueue.Message) -> None:
    """bench.flow: journal each start (monotonic clock, shared by the machine's processes)
    to the file BENCH_RATE_JOURNAL names; one short O_APPEND write per line."""
    import os
    import time

    with open(os.environ["BENCH_RATE_JOURNAL"], "a") as journal:
        journal.write(f"{time.monotonic()}\n")
