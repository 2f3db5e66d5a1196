"""No-op consumers the drain benchmark runs (registered when the bench app is installed)."""

from __future__ import annotations

import itertools
from pathlib import Path

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
    """Journal every run, so that bench.soak checks the run's history (tests/history)."""
    _soak_run(message, seconds=0.0)


@sqlqueue.consumer("bench.soak", group="soak-ordered", ordered=True)
def soak_ordered(message: sqlqueue.Message) -> None:
    """The same in offset order, taking a little time, so that two runs in one partition
    that overlapped would show (guarantee I5)."""
    _soak_run(message, seconds=0.005)


#: bench.soak's batch group: ordered batches of up to this many messages (issue 55)
SOAK_MAX_BATCH = 50


@sqlqueue.batch_consumer("bench.soak", group="soak-batch", ordered=True,
                         max_batch=SOAK_MAX_BATCH)
def soak_batch(messages: list[sqlqueue.Message]) -> dict[sqlqueue.Message, BaseException]:
    """The soak's planned failures (a first attempt in 25) returned in the mapping; the
    engine gives back what follows the first of them in the batch, uncharged. Every
    message is journalled with the call's times, its outcome and the call's name."""
    import os
    import time
    import zlib

    started = time.time() * 1000
    name = f"{os.getpid()}-{next(_soak_calls)}"
    visible = [_visible_until(m) for m in messages]
    failures: dict[sqlqueue.Message, BaseException] = {}
    outcomes = []
    for message in messages:
        if failures:
            outcomes.append("uncharged")  # behind the failed one: given back
        elif message.attempt == 1 and zlib.crc32(message.id.encode()) % 25 == 0:
            failures[message] = RuntimeError(f"{message.id}: the soak's planned failure")
            outcomes.append("fail")
        else:
            outcomes.append("ok")
    _journal_many(messages, started, outcomes, visible, name)
    return failures


#: the soak batch calls' names (with their process's id)
_soak_calls = itertools.count(1)


def _soak_run(message: sqlqueue.Message, seconds: float) -> None:
    """One handler run of the soak: a first attempt of one message in 25 fails (retries
    and backoff are checked too); the run is journalled whatever happens (its outcome,
    its times on this machine's clock, and the visibility deadline of its delivery)."""
    import time
    import zlib

    started = time.time() * 1000
    visible_until = _visible_until(message)
    outcome = "ok"
    running = _long_run(message)
    try:
        if running is not None:
            # A long run bench.soak may freeze its process in (SIGSTOP past the lease):
            # the marker file says which process runs one now.
            running.write_text(str(started))
            seconds = SOAK_LONG_RUN_S
        time.sleep(seconds)
        if message.attempt == 1 and zlib.crc32(message.id.encode()) % 25 == 0:
            outcome = "fail"
            raise RuntimeError(f"{message.id}: the soak's planned failure")
    finally:
        if running is not None:
            running.unlink(missing_ok=True)
        _journal(message, started, outcome, visible_until)


#: bench.soak: one first attempt in SOAK_LONG_RUN_EVERY of the ordered group runs this long
SOAK_LONG_RUN_S, SOAK_LONG_RUN_EVERY = 3.0, 150


def _long_run(message: sqlqueue.Message) -> Path | None:
    """The marker file of a long ordered run, or None (a quick run, or not a soak of
    bench.soak's with BENCH_SOAK_DIR)."""
    import os
    import zlib

    folder = os.environ.get("BENCH_SOAK_DIR")
    if (not folder or message.consumer_group != "soak-ordered" or message.attempt != 1
            or zlib.crc32(message.id.encode()) % SOAK_LONG_RUN_EVERY != 1):
        return None
    return Path(folder) / f"running-{os.getpid()}-{message.partition_key}-{message.offset}"


def _visible_until(message: sqlqueue.Message) -> float | None:
    """This delivery's visibility deadline (None: acked already; 0: marked again since,
    so its deadline had passed)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT invisible_until, retry_count FROM queue_delivery_state WHERE "
            "consumer_group = %s AND topic = %s AND partition_key = %s AND message_offset = %s",
            [message.consumer_group, message.topic, message.partition_key, message.offset])
        row = cursor.fetchone()
    if not row or not row[0]:
        return None
    return float(row[0]) if int(row[1]) == message.attempt - 1 else 0.0


def _journal_many(messages: list[sqlqueue.Message], started_ms: float, outcomes: list[str],
                  visible_until: list[float | None], batch: str) -> None:
    """A batch call's rows of the journal, in one statement."""
    import os
    import time

    from django.db import connection

    finished = time.time() * 1000
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO soak_journal (grp, message_offset, partition_key, msg_id, attempt, "
            "pid, started_ms, finished_ms, outcome, visible_until, batch) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [[m.consumer_group, m.offset, m.partition_key, m.id, m.attempt, os.getpid(),
              started_ms, finished, outcome, visible, batch]
             for m, outcome, visible in zip(messages, outcomes, visible_until, strict=True)])


def _journal(message: sqlqueue.Message, started_ms: float, outcome: str,
             visible_until: float | None) -> None:
    """One row per handler run: which delivery, in which process, from when to when."""
    import os
    import time

    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO soak_journal (grp, message_offset, partition_key, msg_id, attempt, "
            "pid, started_ms, finished_ms, outcome, visible_until) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [message.consumer_group, message.offset, message.partition_key, message.id,
             message.attempt, os.getpid(), started_ms, time.time() * 1000, outcome,
             visible_until])


@sqlqueue.consumer("bench.rate", group="bench-rate",
                   rate_limit=float(__import__("os").environ.get("BENCH_RATE_LIMIT", "100")))
def rate_limited(message: sqlqueue.Message) -> None:
    """bench.flow: journal each start (monotonic clock, shared by the machine's processes)
    to the file BENCH_RATE_JOURNAL names; one short O_APPEND write per line."""
    import os
    import time

    with open(os.environ["BENCH_RATE_JOURNAL"], "a") as journal:
        journal.write(f"{time.monotonic()}\n")


#: the live traffic of bench.scale (beside garbage collection): its handler appends each
#: message's publish-to-handled latency (ms, from the sender's ``t``) to this file
LIVE_TOPIC = "bench.scale.live"
LIVE_FILE_VARIABLE = "BENCH_LIVE_FILE"


@sqlqueue.consumer(LIVE_TOPIC, group="bench-scale-live")
def live(message: sqlqueue.Message) -> None:
    import os
    import time

    path = os.environ.get(LIVE_FILE_VARIABLE)
    if path:
        with open(path, "a") as journal:
            journal.write(f"{time.time():.4f} {(time.time() - message.payload['t']) * 1000:.2f}\n")


#: bench.failure_paths: the same messages acked, rejected, and failing twice then acked
FAILURE_TOPIC = "bench.failures"


@sqlqueue.consumer(FAILURE_TOPIC, group="bench-fail-ack")
def failure_paths_ack(message: sqlqueue.Message) -> None:
    return None


@sqlqueue.consumer(FAILURE_TOPIC, group="bench-fail-reject")
def failure_paths_reject(message: sqlqueue.Message) -> None:
    raise sqlqueue.Reject("bench: rejected")


@sqlqueue.consumer(FAILURE_TOPIC, group="bench-fail-twice", max_attempts=3,
                   min_backoff=0.001, max_backoff=0.001)
def failure_paths_twice(message: sqlqueue.Message) -> None:
    if message.attempt < 3:
        raise RuntimeError("bench: fails twice")


#: bench.drain --group bench-batch: a no-op batch consumer of the drain topic (issue 55)
@sqlqueue.batch_consumer(TOPIC, group="bench-batch", max_batch=500)
def batch_noop(messages: list[sqlqueue.Message]) -> None:
    return None
