"""Running one handler call on a pool thread, and turning what happened into an outcome."""

from __future__ import annotations

import inspect
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from asgiref.sync import async_to_sync
from django.db import Error as AnyDatabaseError
from django.db import connections, transaction

from sqlqueue import events, storage, tracing
from sqlqueue.consuming.clock import SYSTEM_CLOCK, HostClock
from sqlqueue.consuming.failure_text import described, error_text
from sqlqueue.consuming.message import Message, Reject, Retry
from sqlqueue.consuming.outcomes import DeliveredAck, ack_delivered
from sqlqueue.consuming.partition import Hold
from sqlqueue.exceptions import SqlqueueError
from sqlqueue.naming import storable_text
from sqlqueue.storage.sql.base import FetchedRow

if TYPE_CHECKING:
    from sqlqueue.consuming.registry import Consumer

logger = logging.getLogger("sqlqueue.consumer")

#: the longest ``Retry(delay=...)`` honoured (a year; ``inf`` means that): a delay the
#: database's epoch-ms columns cannot hold would otherwise stop the runner
MAX_RETRY_DELAY = 365 * 24 * 3600.0
#: What a handler's run came to: "ack" (returned: the runner writes the ack), "acked" (an
#: ``atomic=True`` handler: its own transaction wrote the ack), "retry", "fail",
#: "reject", "not_started" (given back). The same words label ``sqlqueue_handled_total``.
OutcomeKind = Literal["ack", "acked", "retry", "fail", "reject", "not_started"]


class DeliveryView(Protocol):
    """What a handler thread may ask of the subscriber that made a delivery, answered
    from its in-memory view (never a query): ``sqlqueue.consuming.delivering.HeldView``."""

    def may_start(self, delivery: Delivery) -> bool:
        """Is the partition's lease still trusted in the delivery's tenure, and
        is the delivery still the message's current one, within its visibility timeout?"""
        ...

    def hold(self, delivery: Delivery, seconds: float) -> None:
        """``extend_visibility()`` moved its timeout: do not deliver it again before."""
        ...

    def may_extend(self, delivery: Delivery) -> bool:
        """Is the partition's lease still trusted in the delivery's tenure (a partition
        being handed over included)? A holder that lost it must not push back a timeout
        the new holder has already read (guarantee I5)."""
        ...


class Unchecked:
    """The view of a delivery made outside a subscriber (tests): it may always start."""

    def may_start(self, delivery: Delivery) -> bool:
        return True

    def hold(self, delivery: Delivery, seconds: float) -> None:
        pass

    def may_extend(self, delivery: Delivery) -> bool:
        return True


@dataclass
class Delivery:
    """A message handed to the handler pool."""

    consumer: Consumer
    alias: str
    partition_key: str
    row: FetchedRow
    attempt: int
    sequence: int
    view: DeliveryView = field(default_factory=Unchecked, repr=False)
    tenure: int | None = None  # of the partition's lease when it was delivered (Lease)
    #: the database server that delivered it (the runner's, checked in the transaction
    #: that marked it): an atomic handler commits its ack there or nowhere (guarantee I16)
    server: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # queued -> started | given_back | refused; started -> finished | timed_out -> returned_late
    _state: str = "queued"
    started_at: float = 0.0  # host_clock.monotonic() when a handler thread started it
    host_clock: HostClock = field(default=SYSTEM_CLOCK, repr=False)
    # False when the handler runs on the caller's connection, in the caller's transaction
    # (sqlqueue.testing): a second connection would wait on its locks.
    own_connection: bool = True
    #: how far its handler's ``extend_visibility()`` pushed its timeout back (its handler
    #: thread writes it, the main thread reads it through the Entry)
    hold: Hold = field(default_factory=Hold, repr=False)
    #: the handler call it ran in: a batch consumer's deliveries share one (0: its own)
    run: int = 0
    yields: bool = False  # its partition is failing: it yields (consuming/fairness.py)
    place: float = 0.0  # in the pool's queue, after its priority (host monotonic seconds)

    def sort_key(self) -> tuple[int, float, int]:
        return (self.row.priority, self.place, self.sequence)

    def start(self) -> bool:
        """Claim the delivery for a handler thread; False if it was given back, if the
        partition's lease can no longer be trusted (then nothing starts: guarantee I5), or if
        its visibility timeout ran out while it waited (guarantee I10)."""
        with self._lock:
            if self._state != "queued":
                return False
            # Not if the lease is no longer trusted (guarantee I5), nor if its visibility
            # timeout ran out while it waited in the queue (the main thread was held
            # up): the message may be delivered again already (guarantee I10).
            if not self.view.may_start(self):
                # Out of "queued" for good: the main thread, told it did not start, must
                # not take it back again (counted out of flight twice, the runner's tally
                # went below zero: --max-messages or --until-empty never saw zero again).
                self._state = "refused"
                return False
            self._state = "started"
            self.started_at = self.host_clock.monotonic()
            return True

    def time_out(self) -> bool:
        """The consumer's ``timeout`` passed while the handler runs: its outcome is
        decided now (failed); False if the handler finished first."""
        with self._lock:
            if self._state != "started":
                return False
            self._state = "timed_out"
            return True

    def finish(self) -> bool:
        """The handler returned: False if it had timed out (its outcome was decided)."""
        with self._lock:
            if self._state == "timed_out":
                self._state = "returned_late"
                return False
            self._state = "finished"
            return True

    @property
    def running(self) -> bool:
        """A handler thread is in the handler (past its timeout or not)."""
        return self._state in ("started", "timed_out")

    @property
    def queued(self) -> bool:
        """Handed to the pool, and no handler thread has taken it yet."""
        return self._state == "queued"

    @property
    def answered(self) -> bool:
        """Its outcome is decided (the handler returned, or ran past its timeout): the
        message is never delivered again for having outlived its visibility timeout
        while that outcome waits to be recorded."""
        return self._state in ("finished", "timed_out", "returned_late")

    @property
    def given_back(self) -> bool:
        return self._state == "given_back"

    @property
    def refused(self) -> bool:
        """A handler thread found the partition's lease no longer trusted: not started."""
        return self._state == "refused"

    def give_back(self) -> bool:
        """Take back a delivery no handler started (shutdown); False if one did."""
        with self._lock:
            if self._state != "queued":
                return False
            self._state = "given_back"
            return True


@dataclass(frozen=True)
class Outcome:
    delivery: Delivery
    kind: OutcomeKind
    error: str = ""
    delay: float | None = None  # Retry(delay=...)
    #: what a failed handler raised (kind "fail"), for sqlqueue.testing's report; held
    #: only until the outcome is recorded
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    #: what the message asked (``subject_of``), for the failure's log line (kind "fail")
    subject: str = field(default="", compare=False)


def published_id(row: FetchedRow) -> str:
    """The id the message was published with: a replayed dead letter keeps its own. A
    detail this cannot read (written by another program) leaves the row's id."""
    if row.failure_detail:
        try:
            replay_of = json.loads(row.failure_detail).get("replay_of") or {}
            return str(replay_of.get("id", row.id))
        except (ValueError, AttributeError, TypeError, RecursionError):
            pass
    return row.id


def build_message(delivery: Delivery, extend: bool = True) -> Message:
    row = delivery.row
    message_id = published_id(row)
    return Message(
        topic=delivery.consumer.topic,
        partition_key=delivery.partition_key,
        offset=row.offset,
        id=message_id,
        body=row.payload,
        metadata=json.loads(row.metadata) if row.metadata else {},
        attempt=delivery.attempt,
        created_at_ms=row.created_at,
        published_at_ms=row.published_at,
        consumer_group=delivery.consumer.group,
        extend=(lambda seconds: _extend_visibility(delivery, seconds)) if extend else None,
    )


def subject_of(delivery: Delivery) -> str:
    """What the message asks its handler to do, in the handler's own words, for the log
    lines of a failure: a handler with a ``describe_message(message) -> str | None``
    method names it (a Tasks backend's worker: "task app.tasks.send_invoice"), since the
    topic and offset alone do not say which task failed. "" when the handler names
    nothing or cannot read the message."""
    describe = getattr(delivery.consumer.handler, "describe_message", None)
    if describe is None:
        return ""
    try:
        return str(describe(build_message(delivery, extend=False)) or "")
    except Exception:  # a log line must not fail on a message its handler refuses
        return ""


def handle(delivery: Delivery) -> Outcome:
    """Call the handler; never raises (a handler's exception is an outcome)."""
    consumer = delivery.consumer
    try:
        message = build_message(delivery)
        with tracing.consumer_span(consumer.topic, consumer.group, delivery.partition_key,
                                   delivery.row.offset, message.id, delivery.attempt,
                                   message.metadata):
            if consumer.atomic:
                if not _run_atomic(delivery, message):
                    return Outcome(delivery, "not_started")
                return Outcome(delivery, "acked")
            if not delivery.view.may_start(delivery):
                return Outcome(delivery, "not_started")
            call_handler(consumer.handler, message)
            return Outcome(delivery, "ack")
    except (Retry, Reject) as exc:
        return failure_outcome(delivery, exc)
    except KeyboardInterrupt:
        raise  # ^C where handlers run on the caller's thread (sqlqueue.testing): stop
    except BaseException as exc:  # SystemExit, a custom BaseException: an outcome too
        if isinstance(exc, AnyDatabaseError):  # InterfaceError too (a dropped connection)
            _after_database_error(delivery.alias)
        description = described(exc)
        subject = subject_of(delivery)
        # Each failure at DEBUG: the OutcomeRecorder's FailureLog writes the WARNING lines,
        # one per subscription per interval under a flood.
        logger.debug(
            "Handler %s failed on %s/%s@%s (attempt %s)%s: %s", consumer.name,
            consumer.topic, delivery.partition_key, delivery.row.offset, delivery.attempt,
            f", {subject}" if subject else "", description,
            extra=events.fields(events.HANDLER_FAILED, group=consumer.group,
                                topic=consumer.topic, partition=delivery.partition_key,
                                offset=delivery.row.offset, attempt=delivery.attempt,
                                error=description, subject=subject),
        )
        return Outcome(delivery, "fail", error=error_text(exc), exception=exc,
                       subject=subject)


def failure_outcome(delivery: Delivery, exc: BaseException) -> Outcome:
    """The outcome of ``delivery`` failing with ``exc`` (raised, or a batch handler's
    mapping): ``Retry`` retries, ``Reject`` dead-letters, anything else counts an attempt."""
    if isinstance(exc, Retry):
        return Outcome(delivery, "retry", error=error_text(exc), delay=_delay_of(exc))
    if isinstance(exc, Reject):
        return Outcome(delivery, "reject",
                       error=storable_text(getattr(exc, "reason", "rejected")))
    return Outcome(delivery, "fail", error=error_text(exc), exception=exc)


def _after_database_error(alias: str) -> None:
    """A fresh connection for the next handler. Inside a transaction of the caller's
    (``sqlqueue.testing`` runs each handler in a savepoint of the test's transaction) the
    connection is not ours to close: the savepoint is rolled back instead, the way back to
    a usable transaction (PostgreSQL refuses every statement after an error)."""
    connection = connections[alias]
    if connection.in_atomic_block:
        transaction.set_rollback(True, using=alias)
    else:
        connection.close()


def call_handler(handler: Callable[[Message], Any], message: Message) -> Any:
    """Call the handler; an ``async def`` one (or any that returns an awaitable) is run to
    completion before the message counts as handled, never acked unawaited.

    ``async_to_sync`` runs the coroutine on an event loop of its own while this pool thread
    waits, and sends the async ORM's ``sync_to_async`` calls back to this thread: they use
    this thread's connection, so ``atomic=True`` wraps them in the handler's transaction.
    """
    result = handler(message)
    if result is not None and inspect.isawaitable(result):  # most return None: no check
        return async_to_sync(_awaited)(result)
    return result


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _run_atomic(delivery: Delivery, message: Message) -> bool:
    """The handler's writes and the ack commit together, or not at all (guarantee I13).
    False if the delivery may no longer start once its transaction is open."""
    consumer = delivery.consumer
    with transaction.atomic(using=delivery.alias):
        # Opening the transaction (a connection, a busy SQLite file) can outlast what was
        # left of the visibility timeout when the thread took the delivery.
        if not delivery.view.may_start(delivery):
            return False
        call_handler(consumer.handler, message)
        confirm_server(delivery)
        ack_delivered(delivery.alias, consumer.group, consumer.topic, [
            DeliveredAck(delivery.partition_key, delivery.row.offset, delivery.attempt)])
    return True


def confirm_server(delivery: Delivery) -> None:
    """Inside an atomic handler's transaction, before its ack: this connection must reach
    the server that delivered the message. After a failover a queued delivery of the old
    primary can open a fresh connection to the promoted replica before the runner has
    noticed; there the same offset may name another message, which the ack would mark
    handled unseen (guarantee I16). The handler's writes are rolled back with it."""
    if delivery.server is None:
        return
    connection = connections[delivery.alias]
    with connection.cursor() as cursor:
        now = storage.store(connection).server_identity(cursor)
    if now != delivery.server:
        raise DeliveredByAnotherServer(
            f"{delivery.consumer.topic}/{delivery.partition_key}@{delivery.row.offset} was "
            f"delivered by the database server {delivery.server!r}, but this handler's "
            f"connection reaches {now!r} (a failover): its transaction is rolled back and "
            "its ack not written there (guarantee I16).")


class DeliveredByAnotherServer(SqlqueueError):
    """An atomic handler's connection reached another server than the delivery's."""


def _extend_visibility(delivery: Delivery, seconds: float) -> None:
    consumer = delivery.consumer
    if not delivery.view.may_extend(delivery):
        # Its lease ran out (the process was frozen, or cut off from the database): the
        # partition's new holder waits for the timeout it read when it took the lease,
        # and must not find the run still going past it.
        raise SqlqueueError(
            f"Cannot extend the visibility of {consumer.topic}/{delivery.partition_key}"
            f"@{delivery.row.offset}: this subscriber no longer holds the partition's lease "
            "(another may have taken it over); the message will be delivered again.")
    connection = connections[delivery.alias]
    side = None
    if connection.in_atomic_block and delivery.own_connection:
        # Inside an atomic handler the change would only be seen at its commit: write it
        # on a connection of its own so that it takes effect now.
        side = connections.create_connection(delivery.alias)
        connection = side
    try:
        with connection.cursor() as cursor:
            changed = storage.store(connection).extend_visibility(
                cursor, consumer.group, consumer.topic, delivery.partition_key,
                delivery.row.offset, round(seconds * 1000),
            )
    finally:
        if side is not None:
            side.close()
    if changed:
        delivery.view.hold(delivery, seconds)
    else:
        raise SqlqueueError(
            f"Cannot extend the visibility of {consumer.topic}/{delivery.partition_key}"
            f"@{delivery.row.offset}: it is no longer in flight for {consumer.group!r}."
        )


def _delay_of(retry: Retry) -> float | None:
    """A ``Retry``'s delay, at most ``MAX_RETRY_DELAY`` (``inf`` included); None (the
    consumer's backoff) if unusable: NaN, or whatever a subclass set."""
    delay = getattr(retry, "delay", None)
    if not isinstance(delay, int | float) or isinstance(delay, bool) or not delay >= 0:
        return None
    return float(min(delay, MAX_RETRY_DELAY))
