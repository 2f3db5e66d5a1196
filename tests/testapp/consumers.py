"""Consumers for the acceptance tests, which run them in ``runconsumer`` subprocesses.

Each handler journals its calls in ``HandlerCall`` and obeys instructions in the payload:
``{"sleep": seconds, "fail_times": n, "reject": true}``.
"""

from __future__ import annotations

import os
import time

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
    if message.attempt <= int(instructions.get("fail_times", 0)):
        raise RuntimeError(f"failing attempt {message.attempt} on purpose")
    journal(message, "finished")


@sqlqueue.consumer("accept.work", group="workers")
def work(message: sqlqueue.Message) -> None:
    obey(message)


@sqlqueue.consumer("accept.work", group="auditors", ordered=True)
def audit(message: sqlqueue.Message) -> None:
    obey(message)
