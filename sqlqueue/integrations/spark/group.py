"""A stream that is a consumer group: ``option("consumerGroup", G)``.

The stream reads the topic's log in offset order; when Spark has finished a micro-batch,
the group's watermark on every partition of the topic moves to the batch's last offset,
in one transaction (``queue_offsets``, the RFC's contiguous-ack watermark). So the group
shows in the lag pages and holds garbage collection back like any other.

A Spark consumer group is exclusive: it takes the leases of every partition of the topic
under one subscriber name (``spark:G`` unless ``subscriberName`` says otherwise), and it
refuses to start, or stops, when another live subscriber (a ``runconsumer`` worker,
another stream) is a member of the group on that topic or holds one of its partitions.
Every ack runs after share-locking the group's leases and checking that each is still
this subscriber's, with the generation it acquired (fencing: a subscriber that lost a
lease never acks in its name). This runs on Spark's driver, in the process that plans
the micro-batches.
"""

from __future__ import annotations

import logging
import time

from sqlqueue.integrations.spark.connect import Connection
from sqlqueue.integrations.spark.errors import GroupNotExclusive
from sqlqueue.integrations.spark.options import SourceOptions

logger = logging.getLogger("sqlqueue.spark")

ENSURE_BATCH = 500  # offsets rows created per statement


class ConsumerGroup:
    def __init__(self, options: SourceOptions) -> None:
        assert options.consumer_group is not None and options.topic is not None
        self.group = options.consumer_group
        self.topic = options.topic
        self.name = options.subscriber_name or f"spark:{self.group}"
        self.duration_ms = options.lease_duration_ms
        self.renew_interval = options.lease_renew_interval
        self.generations: dict[str, int] = {}  # partition -> generation acquired
        self.acked_through = -1
        self._next_tick = 0.0
        self._known_head = -1

    # -- where the group stands -----------------------------------------------------------
    def position(self, db: Connection) -> int | None:
        """The first offset the group has not finished: one past its lowest watermark
        (None: the group has never consumed this topic)."""
        rows = db.rows(db.sql.group_watermarks(self.group, self.topic))
        return min(int(w) for _, w in rows) + 1 if rows else None

    # -- membership ---------------------------------------------------------------------------
    def tick(self, db: Connection, head: int, force: bool = False) -> None:
        """Every ``leaseRenewInterval``: heartbeat, take every partition (new ones too),
        and check that nobody else works for the group."""
        now = time.monotonic()
        if not force and now < self._next_tick and head == self._known_head:
            return
        self._next_tick = now + self.renew_interval
        sql = db.sql
        db.run(sql.heartbeat(self.group, self.topic, self.name))
        others = [n for n in (r[0] for r in db.rows(
            sql.live_subscribers(self.group, self.topic, self.duration_ms))) if n != self.name]
        if others:
            raise GroupNotExclusive(
                f"consumer group {self.group!r} on topic {self.topic!r} has other live "
                f"subscribers ({', '.join(others[:5])}); a Spark consumer group must be the "
                "only one: stop them, or stream as another group")
        # Extended at the generations this stream holds, lapsed ones too (a micro-batch
        # longer than the lease) as long as nobody took them; one that changed hands is
        # left alone, and _adopt stops the stream. In batches: three parameters each.
        held = sorted(self.generations)
        for start in range(0, len(held), ENSURE_BATCH):
            db.run(sql.renew_leases(self.group, self.topic, self.name, {
                p: self.generations[p] for p in held[start:start + ENSURE_BATCH]}))
        missing = []
        if head != self._known_head:
            partitions = [r[0] for r in db.rows(sql.discover_partitions(self.topic))]
            missing = [p for p in partitions if p not in self.generations]
            self._known_head = head
        for start in range(0, len(missing), ENSURE_BATCH):
            db.run(sql.acquire_leases(self.group, self.topic, missing[start:start + ENSURE_BATCH],
                                      self.name, self.duration_ms))
        self._adopt(db)

    def _adopt(self, db: Connection, *, lock: bool = False) -> None:
        """Check the leases against what this stream holds."""
        held_by_others = []
        for partition, owner, generation, age in db.rows(
                db.sql.list_leases(self.group, self.topic, lock=lock)):
            if owner == self.name:
                known = self.generations.setdefault(partition, int(generation))
                if known != int(generation):
                    raise GroupNotExclusive(
                        f"the lease of {self.topic!r}/{partition!r} for group {self.group!r} "
                        "changed hands while this stream held it (generation "
                        f"{known} -> {generation}); another subscriber may have processed "
                        "its messages")
            elif owner and int(age) < self.duration_ms:
                held_by_others.append(f"{partition} ({owner})")
        if held_by_others:
            raise GroupNotExclusive(
                f"consumer group {self.group!r} on topic {self.topic!r}: partitions held by "
                f"other subscribers: {', '.join(held_by_others[:5])}; a Spark consumer group "
                "must be the only one")

    # -- acks -----------------------------------------------------------------------------------
    def register(self, db: Connection, start: int, head: int) -> None:
        """Before the first micro-batch: take the partitions, and create the group's
        offsets rows at ``start - 1`` where it has none (rows of a group that consumed
        before keep their watermark)."""
        self.tick(db, head, force=True)
        partitions = sorted(self.generations)
        with db.transaction():
            for first in range(0, len(partitions), ENSURE_BATCH):
                db.run(db.sql.ensure_watermarks(self.group, self.topic,
                                                partitions[first:first + ENSURE_BATCH],
                                                max(0, start - 1)))

    def ack_below(self, db: Connection, end: int) -> None:
        """Spark finished every offset below ``end``: the group is done with them on
        every partition. One transaction, fenced by the leases."""
        upto = end - 1
        if upto <= self.acked_through:
            return
        with db.transaction():
            self._adopt(db, lock=True)
            partitions = sorted(self.generations)
            for first in range(0, len(partitions), ENSURE_BATCH):
                db.run(db.sql.ensure_watermarks(self.group, self.topic,
                                                partitions[first:first + ENSURE_BATCH], 0))
            db.run(db.sql.advance_watermarks(self.group, self.topic, upto))
            db.run(db.sql.drop_open_states(self.group, self.topic, upto))
        self.acked_through = upto
        logger.info("Consumer group %r acked %r up to offset %s.", self.group, self.topic, upto)

    def leave(self, db: Connection) -> None:
        """A graceful stop: hand the partitions back and say goodbye."""
        db.run(db.sql.release_leases(self.group, self.topic, self.name))
        db.run(db.sql.deregister(self.group, self.topic, self.name))
        self.generations.clear()
