"""The repairs of ``manage.py queue``: ``retry-now``, ``reset-position``,
``retire-group``, ``cancel`` and ``gc``. The destructive ones want ``--yes``."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import CommandError, OutputWrapper

from sqlqueue.conf import get_settings
from sqlqueue.management.queue_verbs.common import alias_of, require_known
from sqlqueue.operations.positions import InvalidPosition, reset_position, retry_now


def retry_waiting_now(out: OutputWrapper, options: dict[str, Any]) -> None:
    """``retry-now``: messages waiting on backoff are delivered again now."""
    require_known(options["group"], options["topic"])
    count = retry_now(options["group"], options["topic"], options["partition"],
                      using=alias_of(options["topic"]))
    out.write(f"{count} message(s) will be delivered again now.")


def move_position(out: OutputWrapper, options: dict[str, Any]) -> None:
    """``reset-position``: rewind a group on a partition, or skip to its head."""
    require_known(options["group"], options["topic"])
    if not options["yes"]:
        raise CommandError("Resetting a position redelivers or skips messages: add --yes "
                           "to confirm.")
    try:
        moved = reset_position(options["group"], options["topic"], options["partition"],
                               deliver_from=options["deliver_from"],
                               to_head=options["to_head"],
                               using=alias_of(options["topic"]))
    except InvalidPosition as error:
        raise CommandError(str(error)) from None
    out.write(moved.describe())


def retire(out: OutputWrapper, options: dict[str, Any]) -> None:
    """``retire-group``: delete what a group left, so that garbage collection no longer
    waits for it."""
    from sqlqueue.operations.retire import CannotRetire, group_topics, retire_group

    group, topic = options["group"], options["topic"]
    if not options["yes"]:
        topics = [topic] if topic else group_topics(group, get_settings().DATABASE)
        raise CommandError(
            f"Retiring {group!r} deletes its positions, delivery state and dead letters "
            f"on {', '.join(topics) or 'no topic'} for good: add --yes to confirm.")

    def progress(table: str, done: int) -> None:
        out.write(f"  {table}: {done} deleted", ending="\r")

    try:
        retired = retire_group(group, topic, on_progress=progress,
                               using=alias_of(topic) if topic else None)
    except CannotRetire as error:
        raise CommandError(str(error)) from None
    out.write(retired.describe())


def cancel(out: OutputWrapper, options: dict[str, Any]) -> None:
    """``cancel``: settle pending messages of a group as cancelled."""
    from sqlqueue.operations.cancel import InvalidCancel, cancel_messages

    if not options["yes"]:
        raise CommandError("Cancelled messages never run for the group: add --yes to "
                           "confirm.")
    try:
        result = cancel_messages(
            options["group"], options["topic"], ids=options["ids"],
            partition_key=options["partition"], upto_offset=options["upto"],
            reason=options["reason"], using=alias_of(options["topic"]),
            on_progress=lambda n: out.write(f"  {n} cancelled", ending="\r"))
    except InvalidCancel as error:
        raise CommandError(str(error)) from None
    out.write(result.describe(options["group"], options["topic"]))


def collect_garbage_now(out: OutputWrapper, options: dict[str, Any]) -> None:
    """``gc``: delete what every known group has finished (``--share``: the part of the
    time spent deleting, the rest paused, for live traffic's sake)."""
    from sqlqueue.operations.gc import collect_garbage

    started = time.monotonic()

    def progress(total: int) -> None:
        # A deep collection (a backlog of millions) takes minutes: the running total
        # and its pace, on one line rewritten.
        elapsed = max(time.monotonic() - started, 1e-3)
        out.write(f"  deleted {total} so far, {total / elapsed:,.0f} rows/s", ending="\r")

    collected = collect_garbage(progress, share=options.get("share") or 1.0)
    elapsed = time.monotonic() - started
    out.write(f"Deleted {collected.messages} message(s) every known group had "
              f"finished, in {elapsed:.1f} s.")
    if collected.task_results:
        out.write(f"Deleted {collected.task_results} task result(s) older than "
                  "their RESULT_RETENTION.")
    if collected.idempotency_keys:
        out.write(f"Deleted {collected.idempotency_keys} idempotency key(s) past "
                  "IDEMPOTENCY_WINDOW.")
