"""Consumers for the acceptance tests, which run them in ``runconsumer`` subprocesses.

Each handler journals its calls in ``HandlerCall`` and obeys instructions in the payload:
``{"sleep": seconds, "fail_times": n, "reject": true, "unknown_sku": text}`` (the last
raises ``ValueError`` quoting the payload's text, as a handler's lookup would).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator

import sqlqueue
from tests.testapp.models import HandlerCall


def journal(message: sqlqueue.Message, event: str) -> None:
    HandlerCall.objects.create(
        group=message.consumer_group, topic=message.topic,
        partition_key=message.partition_key, message_offset=message.offset,
        message_id=message.id, attempt=message.attempt, event=event, pid=os.getpid(),
        at=time.monotonic(),
    )


def obey(message: sqlqueue.Message) -> None:
    journal(message, "started")
    instructions = message.payload if isinstance(message.payload, dict) else {}
    time.sleep(float(instructions.get("sleep", 0)))
    if instructions.get("reject"):
        raise sqlqueue.Reject("the payload asked for it")
    if "unknown_sku" in instructions:
        raise ValueError(f"unknown sku {instructions['unknown_sku']}")
    if message.attempt <= int(instructions.get("fail_times", 0)):
        raise RuntimeError(f"failing attempt {message.attempt} on purpose")
    journal(message, "finished")


@sqlqueue.consumer("accept.work", group="workers")
def work(message: sqlqueue.Message) -> None:
    obey(message)


@sqlqueue.consumer("accept.work", group="auditors", ordered=True)
def audit(message: sqlqueue.Message) -> None:
    obey(message)


@sqlqueue.consumer("accept.failover", group="failover")
def outlive_the_connection(message: sqlqueue.Message) -> None:
    """A handler that does not touch the database (it calls an API, say): it can outlive
    the connection it was delivered on. Journals to the file SQLQUEUE_TEST_JOURNAL names,
    which survives whatever happens to the databases."""
    instructions = message.payload if isinstance(message.payload, dict) else {}
    path = os.environ["SQLQUEUE_TEST_JOURNAL"]
    with open(path, "a") as journal:
        journal.write(f"start {message.id} {message.offset}\n")
    with _run_recorded(message):
        time.sleep(float(instructions.get("sleep", 0)))
        if instructions.get("touch_db"):  # a handler that also writes its result to the db
            HandlerCall.objects.create(
                group=message.consumer_group, topic=message.topic,
                partition_key=message.partition_key, message_offset=message.offset,
                message_id=message.id, attempt=message.attempt, event="finished",
                pid=os.getpid(), at=time.monotonic())
    with open(path, "a") as journal:
        journal.write(f"end {message.id} {message.offset}\n")


@contextlib.contextmanager
def _run_recorded(message: sqlqueue.Message) -> Iterator[None]:
    """With SQLQUEUE_TEST_RUNS set (tests/acceptance/histories.py), the run as the
    history checker reads it, one JSON line appended to that file: its times on this
    machine's clock, its outcome, and its delivery's visibility deadline, read at its
    start (on the delivering server, before anything happens to it)."""
    path = os.environ.get("SQLQUEUE_TEST_RUNS")
    if not path:
        yield
        return
    from django.db import DatabaseError, connection

    from tests.history.model import Run, run_line

    started, visible_until, outcome = time.time() * 1000, None, "fail"
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT invisible_until, retry_count FROM queue_delivery_state WHERE "
                "consumer_group = %s AND topic = %s AND partition_key = %s AND "
                "message_offset = %s", [message.consumer_group, message.topic,
                                        message.partition_key, message.offset])
            row = cursor.fetchone()
        if row and row[0]:
            visible_until = float(row[0]) if int(row[1]) == message.attempt - 1 else 0.0
    except DatabaseError:
        pass  # the server went away: not read
    try:
        yield
        outcome = "ok"
    finally:
        run = Run(message.consumer_group, message.topic, message.partition_key,
                  message.offset, message.id, message.attempt,
                  os.environ.get("SQLQUEUE_TEST_RUNNER", str(os.getpid())), started,
                  time.time() * 1000, outcome, visible_until_ms=visible_until)  # type: ignore[arg-type]
        with open(path, "a") as runs:
            runs.write(run_line(run))


@sqlqueue.consumer("accept.failover.atomic", group="failover-atomic", atomic=True)
def atomic_across_a_failover(message: sqlqueue.Message) -> None:
    """An atomic handler (guarantee I13) that works in the database for ``busy`` seconds (a
    statement every 20 ms: a cut connection fails it at once), then records its call in
    its own transaction. Journals to SQLQUEUE_TEST_JOURNAL's file as the one above."""
    from django.db import connection

    instructions = message.payload if isinstance(message.payload, dict) else {}
    path = os.environ["SQLQUEUE_TEST_JOURNAL"]
    with open(path, "a") as file:
        file.write(f"start {message.id} {message.offset}\n")
    deadline = time.monotonic() + float(instructions.get("busy", 0))
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        time.sleep(0.02)
    journal(message, "finished")
    with open(path, "a") as file:
        file.write(f"end {message.id} {message.offset}\n")
@sqlqueue.consumer("accept.patroni", group="patroni")
def across_a_patroni_failover(message: sqlqueue.Message) -> None:
    """For tests/acceptance/test_patroni.py: journals each call's start and end, with the
    wall clock (every process of the machine shares it), to SQLQUEUE_TEST_JOURNAL's file,
    which outlives the killed primary."""
    path = os.environ["SQLQUEUE_TEST_JOURNAL"]
    fields = f"{message.id} {message.offset} {message.partition_key} {message.attempt}"
    with open(path, "a") as file:
        file.write(f"start {fields} {time.time()}\n")
    time.sleep(0.02)  # an API call, say: the database is not touched
    with open(path, "a") as file:
        file.write(f"end {fields} {time.time()}\n")


# -- async def handlers (issue 13): awaited on an event loop, the async ORM inside -------

async def ajournal(message: sqlqueue.Message, event: str) -> None:
    await HandlerCall.objects.acreate(
        group=message.consumer_group, topic=message.topic,
        partition_key=message.partition_key, message_offset=message.offset,
        message_id=message.id, attempt=message.attempt, event=event, pid=os.getpid(),
        at=time.monotonic(),
    )


@sqlqueue.consumer("accept.async", group="asyncworkers")
async def work_async(message: sqlqueue.Message) -> None:
    await asyncio.sleep(0.001)  # a real suspension point: the loop must be running
    await ajournal(message, "finished")


@sqlqueue.consumer("accept.async", group="asyncatomic", atomic=True)
async def work_async_atomic(message: sqlqueue.Message) -> None:
    """Journals "started", then fails the first attempts the payload asks for: inside the
    handler's transaction, so a failed attempt's "started" row must be rolled back."""
    await ajournal(message, "started")
    instructions = message.payload if isinstance(message.payload, dict) else {}
    if message.attempt <= int(instructions.get("fail_times", 0)):
        raise RuntimeError(f"failing attempt {message.attempt} on purpose")
    await ajournal(message, "finished")


# -- flow limits (issue 17): topics of their own, so that no other test runs them ---------

@sqlqueue.consumer("accept.limited", group="limited", rate_limit=30)
def rate_limited(message: sqlqueue.Message) -> None:
    journal(message, "started")


@sqlqueue.consumer("accept.bounded", group="bounded", max_in_flight=3)
def bounded(message: sqlqueue.Message) -> None:
    obey(message)


@sqlqueue.consumer("accept.stuck", group="stuck", timeout=1)
def stuck_first_time(message: sqlqueue.Message) -> None:
    """Stuck (far past its timeout) on the first attempt, quick on the next."""
    journal(message, "started")
    if message.attempt == 1:
        time.sleep(600)
    journal(message, "finished")


@sqlqueue.batch_consumer("accept.batch", group="batchers", max_batch=50)
def load_batch(messages: list[sqlqueue.Message]) -> None:
    """A batch consumer (tests/acceptance/test_batch_runconsumer.py): one journal row per
    message, written in one statement per call, with the call's size in ``event``."""
    HandlerCall.objects.bulk_create([
        HandlerCall(group=m.consumer_group, topic=m.topic, partition_key=m.partition_key,
                    message_offset=m.offset, message_id=m.id, attempt=m.attempt,
                    event=f"batch:{len(messages)}", pid=os.getpid(), at=time.monotonic())
        for m in messages])
