"""What every vendor's statements share; the vendor modules fill in the differences."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.db import IntegrityError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from sqlqueue.horizon import WriteHorizon

MESSAGE_TABLE = "queue_messages"
MessageKey = tuple[str, str]  # (partition_key, id) within one topic


class MessageRow(NamedTuple):
    """One validated message, ready for ``INSERT`` (see sqlqueue.publishing).

    A named tuple rather than a dataclass: publishing makes one per message, and a
    tuple is built several times faster."""

    topic: str
    partition_key: str
    id: str
    payload: bytes
    metadata: str | None  # JSON text, or None for an empty map (the RFC stores NULL)
    published_at: int  # epoch ms, publisher's clock
    priority: int
    delay_ms: int | None  # deliver_after = database now + delay_ms ...
    deliver_at_ms: int  # ... or this absolute epoch ms when delay_ms is None (0 = at once)
    #: the id is a fresh UUID4 made by sqlqueue, so it cannot already be stored
    fresh_id: bool = False

    @property
    def key(self) -> MessageKey:
        return (self.partition_key, self.id)


# =========================================================================================
# Consuming: the statements a subscriber runs. Each is named after what it does; the
# method docstrings say which index serves it.
# =========================================================================================

STATE_TABLE = "queue_delivery_state"
OFFSETS_TABLE = "queue_offsets"
LEASES_TABLE = "queue_partition_leases"
HEARTBEATS_TABLE = "queue_subscriber_heartbeats"
STATE_KEY = ("consumer_group", "topic", "partition_key", "message_offset")
OFFSETS_KEY = ("consumer_group", "topic", "partition_key")


@dataclass(frozen=True, slots=True)
class FetchedRow:
    """A message row joined with this group's delivery state (None: never delivered)."""

    offset: int
    id: str
    payload: bytes
    metadata: str | None
    created_at: int
    published_at: int
    priority: int
    deliver_after: int
    consumer_group: str
    failure_detail: str | None
    acked: bool | None
    invisible_until: int | None
    retry_count: int | None


@dataclass(frozen=True, slots=True)
class Settlement:
    """The new delivery state of one message after its handler ran."""

    partition_key: str
    offset: int
    acked: bool
    invisible_until: int
    last_error: str = ""


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8")
    return str(value)


class ConsumingStatements:
    """Mixin for ``Dialect``: the subscriber's statements, shared shapes."""

    quote: Any
    now_ms_sql: str
    locking_read_suffix: str

    # Vendor hooks -------------------------------------------------------------------
    def upsert_clause(self, key: Sequence[str], assignments: dict[str, str]) -> str:
        """``ON DUPLICATE KEY UPDATE`` / ``ON CONFLICT DO UPDATE``; ``{new}`` marks the
        would-be-inserted value of a column in ``assignments``' expressions."""
        raise NotImplementedError

    def insert_if_absent(self, table: str, columns: Sequence[str], key: Sequence[str]) -> str:
        raise NotImplementedError

    def delete_messages_upto_sql(self) -> str:
        raise NotImplementedError

    def write_horizon(self, cursor: CursorWrapper) -> WriteHorizon | None:
        """``write_horizon``: what the database shows of open transactions, for
        ``sqlqueue.horizon.settled_before`` (None: no transaction can commit out of offset
        order on this database). Read inside a started transaction."""
        raise NotImplementedError

    # fetch_messages ---------------------------------------------------------------------
    _FETCH_COLUMNS = (
        "offset", "id", "payload", "metadata", "created_at", "published_at", "priority",
        "deliver_after", "consumer_group", "failure_detail",
    )

    def _fetch_sql(self, where: str) -> str:
        q = self.quote
        columns = ", ".join(f"m.{q(c)}" for c in self._FETCH_COLUMNS)
        return (
            f"SELECT {columns}, s.{q('acked')}, s.{q('invisible_until')}, "
            f"s.{q('retry_count')} "
            f"FROM {q(MESSAGE_TABLE)} m LEFT JOIN {q(STATE_TABLE)} s "
            f"ON s.{q('consumer_group')} = %s AND s.{q('topic')} = m.{q('topic')} "
            f"AND s.{q('partition_key')} = m.{q('partition_key')} "
            f"AND s.{q('message_offset')} = m.{q('offset')} "
            f"WHERE m.{q('topic')} = %s AND m.{q('partition_key')} = %s AND {where} "
            f"ORDER BY m.{q('offset')}"
        )

    def fetch_messages_sql(self) -> str:
        """``fetch_messages``: the next rows of a partition above an offset, with this
        group's state; a range on ``idx_topic_partition_offset``, then primary-key
        lookups (message row, delivery state)."""
        return self._fetch_sql(f"m.{self.quote('offset')} > %s") + " LIMIT %s"

    def fetch_messages(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str,
        after: int, limit: int,
    ) -> list[FetchedRow]:
        cursor.execute(self.fetch_messages_sql(), [group, topic, partition, after, limit])
        return [self._fetched(r) for r in cursor.fetchall()]

    def fetch_messages_at(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str,
        offsets: Sequence[int],
    ) -> list[FetchedRow]:
        """``fetch_messages_at``: the same, for given offsets (late commits found by a
        sweep)."""
        if not offsets:
            return []
        marks = ", ".join(["%s"] * len(offsets))
        sql = self._fetch_sql(f"m.{self.quote('offset')} IN ({marks})")
        cursor.execute(sql, [group, topic, partition, *offsets])
        return [self._fetched(r) for r in cursor.fetchall()]

    @staticmethod
    def _fetched(r: Sequence[Any]) -> FetchedRow:
        return FetchedRow(
            offset=int(r[0]), id=r[1], payload=bytes(r[2]), metadata=_text(r[3]),
            created_at=int(r[4]), published_at=int(r[5]), priority=int(r[6]),
            deliver_after=int(r[7]), consumer_group=r[8], failure_detail=_text(r[9]),
            acked=None if r[10] is None else bool(r[10]),
            invisible_until=None if r[11] is None else int(r[11]),
            retry_count=None if r[12] is None else int(r[12]),
        )

    # list_offsets -------------------------------------------------------------------------
    def list_offsets_sql(self) -> str:
        """``list_offsets``: offsets stored in (after, upto] of a partition; index-only on
        ``idx_topic_partition_offset``. Used to find late-committed rows."""
        q = self.quote
        return (
            f"SELECT {q('offset')} FROM {q(MESSAGE_TABLE)} WHERE {q('topic')} = %s "
            f"AND {q('partition_key')} = %s AND {q('offset')} > %s AND {q('offset')} <= %s "
            f"ORDER BY {q('offset')} LIMIT %s"
        )

    def list_offsets(
        self, cursor: CursorWrapper, topic: str, partition: str, after: int, upto: int,
        limit: int,
    ) -> list[int]:
        cursor.execute(self.list_offsets_sql(), [topic, partition, after, upto, limit])
        return [int(r[0]) for r in cursor.fetchall()]

    # head_offset -----------------------------------------------------------------------
    def head_offset(self, cursor: CursorWrapper) -> int:
        """``head_offset``: the newest offset of the whole log (primary key, O(1))."""
        q = self.quote
        cursor.execute(f"SELECT MAX({q('offset')}) FROM {q(MESSAGE_TABLE)}")
        row = cursor.fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    # discover_partitions ---------------------------------------------------------------
    def discover_partitions_sql(self) -> str:
        """``discover_partitions``: the distinct partition keys of a topic by a loose
        index scan of ``idx_topic_partition_offset``: one seek per partition, so the
        cost grows with the number of partitions, not of messages."""
        raise NotImplementedError

    def discover_partitions_params(self, topic: str) -> list[Any]:
        return [topic]

    def discover_partitions(self, cursor: CursorWrapper, topic: str) -> list[str]:
        cursor.execute(self.discover_partitions_sql(), self.discover_partitions_params(topic))
        return [r[0] for r in cursor.fetchall() if r[0] is not None]

    # mark_delivered ---------------------------------------------------------------------
    def mark_delivered_sql(self, count: int) -> str:
        """``mark_delivered``: start the visibility clock and charge an attempt, for many
        messages in one statement. An acked row is never touched; a redelivery adds one
        to ``retry_count`` (the first delivery creates the row with 0)."""
        q = self.quote
        columns = (*STATE_KEY, "acked", "invisible_until", "retry_count")
        values = ", ".join(["(%s, %s, %s, %s, 0, %s, 0)"] * count)
        clause = self.upsert_clause(STATE_KEY, {
            # Reads only columns this statement does not assign: order-independent.
            "retry_count": f"CASE WHEN {q('acked')} = 0 THEN {q('retry_count')} + 1 "
                           f"ELSE {q('retry_count')} END",
            "invisible_until": f"CASE WHEN {q('acked')} = 0 THEN {{new}}({q('invisible_until')}) "
                               f"ELSE {q('invisible_until')} END",
        })
        return (
            f"INSERT INTO {q(STATE_TABLE)} ({', '.join(q(c) for c in columns)}) "
            f"VALUES {values} {clause}"
        )

    def mark_delivered(
        self, cursor: CursorWrapper, group: str, topic: str,
        deliveries: Sequence[tuple[str, int, int]],
    ) -> None:
        """``deliveries``: (partition key, offset, invisible_until), any partitions."""
        if not deliveries:
            return
        params: list[Any] = []
        for partition, offset, invisible_until in deliveries:
            params += [group, topic, partition, offset, invisible_until]
        cursor.execute(self.mark_delivered_sql(len(deliveries)), params)

    # settle -------------------------------------------------------------------------------
    def settle_sql(self, count: int) -> str:
        """``settle``: record handler outcomes (acks and scheduled retries) for many
        messages in one statement; an acked row stays acked."""
        q = self.quote
        now = self.now_ms_sql
        columns = (*STATE_KEY, "acked", "invisible_until", "acked_at", "last_error")
        one = f"(%s, %s, %s, %s, %s, %s, CASE WHEN %s THEN {now} ELSE 0 END, %s)"
        clause = self.upsert_clause(STATE_KEY, {
            "acked_at": f"CASE WHEN {q('acked')} = 1 THEN {q('acked_at')} "
                        f"ELSE {{new}}({q('acked_at')}) END",
            "invisible_until": f"CASE WHEN {q('acked')} = 1 THEN {q('invisible_until')} "
                               f"ELSE {{new}}({q('invisible_until')}) END",
            "last_error": f"CASE WHEN {q('acked')} = 1 THEN {q('last_error')} "
                          f"ELSE {{new}}({q('last_error')}) END",
            # Assigned last: MySQL evaluates left to right, and the lines above must read
            # the old value.
            "acked": f"CASE WHEN {q('acked')} = 1 THEN 1 ELSE {{new}}({q('acked')}) END",
        })
        return (
            f"INSERT INTO {q(STATE_TABLE)} ({', '.join(q(c) for c in columns)}) "
            f"VALUES {', '.join([one] * count)} {clause}"
        )

    def settle(
        self, cursor: CursorWrapper, group: str, topic: str, settlements: Sequence[Settlement]
    ) -> None:
        if not settlements:
            return
        params: list[Any] = []
        for s in settlements:
            acked = 1 if s.acked else 0
            params += [group, topic, s.partition_key, s.offset, acked, s.invisible_until, acked,
                       s.last_error]
        cursor.execute(self.settle_sql(len(settlements)), params)

    # give_back ---------------------------------------------------------------------------
    def give_back(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str,
        offset: int, previous_retry_count: int | None,
    ) -> None:
        """``give_back``: undo ``mark_delivered`` for a message that never reached a
        handler (graceful shutdown): no attempt charged, visible again at once."""
        q = self.quote
        key_sql = " AND ".join(f"{q(c)} = %s" for c in STATE_KEY)
        key: list[Any] = [group, topic, partition, offset]
        if previous_retry_count is None:
            cursor.execute(f"DELETE FROM {q(STATE_TABLE)} WHERE {key_sql} AND {q('acked')} = 0",
                           key)
        else:
            cursor.execute(
                f"UPDATE {q(STATE_TABLE)} SET {q('invisible_until')} = 0, "
                f"{q('retry_count')} = %s WHERE {key_sql} AND {q('acked')} = 0",
                [previous_retry_count, *key],
            )

    # extend_visibility -------------------------------------------------------------------
    def extend_visibility(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str, offset: int,
        milliseconds: int,
    ) -> int:
        """``extend_visibility``: invisible for ``milliseconds`` from the database's now;
        returns the number of rows changed (0: already acked or not delivered)."""
        q = self.quote
        key_sql = " AND ".join(f"{q(c)} = %s" for c in STATE_KEY)
        cursor.execute(
            f"UPDATE {q(STATE_TABLE)} SET {q('invisible_until')} = {self.now_ms_sql} + %s "
            f"WHERE {key_sql} AND {q('acked')} = 0",
            [milliseconds, group, topic, partition, offset],
        )
        return int(cursor.rowcount)

    # offsets (watermarks) ------------------------------------------------------------------
    def ensure_watermark(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str
    ) -> int:
        """``ensure_watermark``: create the group's offsets row if missing (this is what
        registers the group with garbage collection), then read the watermark."""
        q = self.quote
        columns = (*OFFSETS_KEY, "offset_acked", "updated_at")
        cursor.execute(
            self.insert_if_absent(OFFSETS_TABLE, columns, OFFSETS_KEY).format(
                values=f"%s, %s, %s, 0, {self.now_ms_sql}"
            ),
            [group, topic, partition],
        )
        cursor.execute(
            f"SELECT {q('offset_acked')} FROM {q(OFFSETS_TABLE)} WHERE "
            + " AND ".join(f"{q(c)} = %s" for c in OFFSETS_KEY),
            [group, topic, partition],
        )
        row = cursor.fetchone()
        return int(row[0]) if row else 0

    def advance_watermark(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str, upto: int
    ) -> int:
        """``advance_watermark``: move the watermark forward, never back."""
        q = self.quote
        cursor.execute(
            f"UPDATE {q(OFFSETS_TABLE)} SET {q('offset_acked')} = %s, "
            f"{q('updated_at')} = {self.now_ms_sql} WHERE "
            + " AND ".join(f"{q(c)} = %s" for c in OFFSETS_KEY)
            + f" AND {q('offset_acked')} < %s",
            [upto, group, topic, partition, upto],
        )
        return int(cursor.rowcount)

    def delete_states_upto(
        self, cursor: CursorWrapper, group: str, topic: str, partition: str, upto: int
    ) -> int:
        """``delete_states_upto``: drop delivery state the watermark covers (primary-key
        range). Run only after ``advance_watermark`` committed."""
        q = self.quote
        cursor.execute(
            f"DELETE FROM {q(STATE_TABLE)} WHERE {q('consumer_group')} = %s AND "
            f"{q('topic')} = %s AND {q('partition_key')} = %s AND {q('message_offset')} <= %s",
            [group, topic, partition, upto],
        )
        return int(cursor.rowcount)

    def topic_watermarks(
        self, cursor: CursorWrapper, topic: str
    ) -> tuple[set[str], dict[str, dict[str, int]]]:
        """``topic_watermarks``: every group known on a topic, and each partition's
        watermarks by group, in one read of ``idx_topic_partition``."""
        q = self.quote
        cursor.execute(
            f"SELECT {q('consumer_group')}, {q('partition_key')}, {q('offset_acked')} "
            f"FROM {q(OFFSETS_TABLE)} WHERE {q('topic')} = %s",
            [topic],
        )
        groups: set[str] = set()
        partitions: dict[str, dict[str, int]] = {}
        for group, partition, watermark in cursor.fetchall():
            groups.add(group)
            partitions.setdefault(partition, {})[group] = int(watermark)
        return groups, partitions

    # dead letters ---------------------------------------------------------------------------
    _DEAD_LETTER_COLUMNS = (
        "topic", "partition_key", "id", "payload", "metadata", "created_at", "published_at",
        "failed_at", "failure_count", "last_error", "original_topic", "failure_detail",
        "priority", "consumer_group",
    )

    def insert_dead_letter_sql(self) -> str:
        """``insert_dead_letter``: copy a message into its dead-letter topic for one group
        (payload copied inside the server); dead-lettering it again updates the row."""
        q = self.quote
        now = self.now_ms_sql
        m = "m."
        select = (
            f"SELECT %s, {m}{q('partition_key')}, %s, {m}{q('payload')}, {m}{q('metadata')}, "
            f"{now}, {m}{q('published_at')}, {now}, %s, %s, {m}{q('topic')}, %s, "
            f"{m}{q('priority')}, %s FROM {q(MESSAGE_TABLE)} m WHERE {m}{q('offset')} = %s"
        )
        clause = self.upsert_clause(("topic", "partition_key", "id"), {
            "failed_at": f"{{new}}({q('failed_at')})",
            "failure_count": f"{{new}}({q('failure_count')})",
            "last_error": f"{{new}}({q('last_error')})",
            "failure_detail": f"{{new}}({q('failure_detail')})",
        })
        columns = ", ".join(q(c) for c in self._DEAD_LETTER_COLUMNS)
        return f"INSERT INTO {q(MESSAGE_TABLE)} ({columns}) {select} {clause}"

    def insert_dead_letter(
        self, cursor: CursorWrapper, *, dead_letter_topic: str, dead_letter_id: str,
        offset: int, attempts: int, last_error: str, detail: str, group: str,
    ) -> None:
        cursor.execute(
            self.insert_dead_letter_sql(),
            [dead_letter_topic, dead_letter_id, attempts, last_error, detail, group, offset],
        )

    def insert_replay(
        self, cursor: CursorWrapper, *, dead_letter_offset: int, replay_id: str, detail: str
    ) -> int:
        """``insert_replay``: copy a dead letter back to its original topic, addressed to
        the group that dead-lettered it; returns the new offset."""
        q = self.quote
        now = self.now_ms_sql
        columns = ("topic", "partition_key", "id", "payload", "metadata", "created_at",
                   "published_at", "priority", "consumer_group", "failure_detail")
        cursor.execute(
            f"INSERT INTO {q(MESSAGE_TABLE)} ({', '.join(q(c) for c in columns)}) "
            f"SELECT {q('original_topic')}, {q('partition_key')}, %s, {q('payload')}, "
            f"{q('metadata')}, {now}, {q('published_at')}, {q('priority')}, "
            f"{q('consumer_group')}, %s FROM {q(MESSAGE_TABLE)} WHERE {q('offset')} = %s",
            [replay_id, detail, dead_letter_offset],
        )
        return int(cursor.lastrowid)

    # leases -------------------------------------------------------------------------------
    def acquire_leases_sql(self, count: int) -> str:
        """``acquire_leases``: take partitions that have no lease, or whose lease expired
        (not renewed for ``duration_ms`` by the database clock). A live lease is left
        alone, whoever holds it. Every change of owner increments ``generation``."""
        q = self.quote
        now = self.now_ms_sql
        expired = f"{q('lease_renewed_at')} < {now} - %s"
        columns = (*OFFSETS_KEY, "leased_by", "leased_at", "lease_renewed_at", "generation")
        one = f"(%s, %s, %s, %s, {now}, {now}, 1)"
        clause = self.upsert_clause(OFFSETS_KEY, {
            # Every condition reads lease_renewed_at, which is assigned last.
            "generation": f"CASE WHEN {expired} THEN {q('generation')} + 1 "
                          f"ELSE {q('generation')} END",
            "leased_by": f"CASE WHEN {expired} THEN {{new}}({q('leased_by')}) "
                         f"ELSE {q('leased_by')} END",
            "leased_at": f"CASE WHEN {expired} THEN {now} ELSE {q('leased_at')} END",
            "lease_renewed_at": f"CASE WHEN {expired} THEN {now} "
                                f"ELSE {q('lease_renewed_at')} END",
        })
        return (
            f"INSERT INTO {q(LEASES_TABLE)} ({', '.join(q(c) for c in columns)}) "
            f"VALUES {', '.join([one] * count)} {clause}"
        )

    def acquire_leases(
        self, cursor: CursorWrapper, group: str, topic: str, partitions: Sequence[str],
        owner: str, duration_ms: int,
    ) -> None:
        if not partitions:
            return
        params: list[Any] = []
        for partition in partitions:
            params += [group, topic, partition, owner]
        params += [duration_ms] * 4  # the four CASE conditions
        cursor.execute(self.acquire_leases_sql(len(partitions)), params)

    def renew_leases(
        self, cursor: CursorWrapper, group: str, topic: str, owner: str, duration_ms: int
    ) -> int:
        """``renew_leases``: extend every lease ``owner`` still holds. An expired lease is
        not revived (it may already be someone else's to take): it must be acquired
        again, which changes its generation."""
        q = self.quote
        now = self.now_ms_sql
        cursor.execute(
            f"UPDATE {q(LEASES_TABLE)} SET {q('lease_renewed_at')} = {now} "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {q('leased_by')} = %s "
            f"AND {q('lease_renewed_at')} >= {now} - %s",
            [group, topic, owner, duration_ms],
        )
        return int(cursor.rowcount)

    def list_leases(
        self, cursor: CursorWrapper, group: str, topic: str, *, lock: bool = False
    ) -> list[tuple[str, str, int, int]]:
        """``list_leases``: (partition, owner, generation, ms since renewal) of every lease
        of a (group, topic); primary-key prefix. ``lock``: share-lock them until commit
        (fencing: the owner cannot change while this transaction writes as owner)."""
        q = self.quote
        cursor.execute(
            f"SELECT {q('partition_key')}, {q('leased_by')}, {q('generation')}, "
            f"{self.now_ms_sql} - {q('lease_renewed_at')} FROM {q(LEASES_TABLE)} "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s"
            + (self.locking_read_suffix if lock else ""),
            [group, topic],
        )
        return [(r[0], r[1], int(r[2]), int(r[3])) for r in cursor.fetchall()]

    def release_leases(
        self, cursor: CursorWrapper, group: str, topic: str, partitions: Sequence[str],
        owner: str,
    ) -> int:
        """``release_leases``: give partitions up (only those ``owner`` holds)."""
        if not partitions:
            return 0
        q = self.quote
        marks = ", ".join(["%s"] * len(partitions))
        cursor.execute(
            f"DELETE FROM {q(LEASES_TABLE)} WHERE {q('consumer_group')} = %s AND "
            f"{q('topic')} = %s AND {q('leased_by')} = %s AND {q('partition_key')} IN ({marks})",
            [group, topic, owner, *partitions],
        )
        return int(cursor.rowcount)

    def purge_abandoned(
        self, cursor: CursorWrapper, group: str, topic: str, older_than_ms: int
    ) -> None:
        """``purge_abandoned``: forget leases and heartbeats nobody renewed for a long
        time. Runs long after such leases could be taken over, so the work of a dead
        subscriber is always recovered before it is forgotten."""
        q = self.quote
        now = self.now_ms_sql
        cursor.execute(
            f"DELETE FROM {q(LEASES_TABLE)} WHERE {q('consumer_group')} = %s AND "
            f"{q('topic')} = %s AND {q('lease_renewed_at')} < {now} - %s",
            [group, topic, older_than_ms],
        )
        cursor.execute(
            f"DELETE FROM {q(HEARTBEATS_TABLE)} WHERE {q('consumer_group')} = %s AND "
            f"{q('topic')} = %s AND {q('heartbeat_at')} < {now} - %s",
            [group, topic, older_than_ms],
        )

    # heartbeats ---------------------------------------------------------------------------
    def heartbeat(self, cursor: CursorWrapper, group: str, topic: str, name: str) -> None:
        """``heartbeat``: this subscriber is alive (database time)."""
        q = self.quote
        now = self.now_ms_sql
        columns = ("consumer_group", "topic", "subscriber_name", "heartbeat_at",
                   "deregistered_at")
        clause = self.upsert_clause(("consumer_group", "topic", "subscriber_name"), {
            "heartbeat_at": f"{{new}}({q('heartbeat_at')})",
            "deregistered_at": "0",
        })
        cursor.execute(
            f"INSERT INTO {q(HEARTBEATS_TABLE)} ({', '.join(q(c) for c in columns)}) "
            f"VALUES (%s, %s, %s, {now}, 0) {clause}",
            [group, topic, name],
        )

    def live_subscribers(
        self, cursor: CursorWrapper, group: str, topic: str, within_ms: int
    ) -> list[str]:
        """``live_subscribers``: names with a heartbeat in the last ``within_ms``."""
        q = self.quote
        cursor.execute(
            f"SELECT {q('subscriber_name')} FROM {q(HEARTBEATS_TABLE)} WHERE "
            f"{q('consumer_group')} = %s AND {q('topic')} = %s AND "
            f"{q('heartbeat_at')} >= {self.now_ms_sql} - %s AND {q('deregistered_at')} = 0 "
            f"ORDER BY {q('subscriber_name')}",
            [group, topic, within_ms],
        )
        return [r[0] for r in cursor.fetchall()]

    def deregister(self, cursor: CursorWrapper, group: str, topic: str, name: str) -> None:
        """``deregister``: a graceful goodbye, so the others rebalance at once."""
        q = self.quote
        cursor.execute(
            f"DELETE FROM {q(HEARTBEATS_TABLE)} WHERE {q('consumer_group')} = %s AND "
            f"{q('topic')} = %s AND {q('subscriber_name')} = %s",
            [group, topic, name],
        )

    # garbage collection -------------------------------------------------------------------
    def delete_messages_upto(
        self, cursor: CursorWrapper, topic: str, partition: str, upto: int, limit: int
    ) -> int:
        """``delete_messages_upto``: garbage-collect the oldest rows of a partition, at most
        ``limit`` per statement (short transactions, short locks)."""
        cursor.execute(self.delete_messages_upto_sql(), [topic, partition, upto, limit])
        return int(cursor.rowcount)


# =========================================================================================
# Operating: what the lag dashboard and ``manage.py queue status`` read. Every statement
# is bounded: one seek per partition, or a scan cut at a cap.
# =========================================================================================

#: SQLite refuses compound SELECTs of more than 500 terms; stay well below.
PENDING_BRANCHES_PER_STATEMENT = 200


@dataclass(frozen=True, slots=True)
class PendingSummary:
    """Messages of one partition above a watermark: how many (counted up to a cap; None
    when not counted) and since when the first of them is due: stored, and past its
    ``deliver_after`` (None: there are none)."""

    count: int | None
    oldest_due_at: int | None


class OperatingStatements:
    """Mixin for ``Dialect``: the operator's reads."""

    quote: Any
    #: makes the per-partition probes use idx_topic_partition_offset without weighing
    #: the other indexes first: planning, not reading, is what they cost otherwise
    offset_index_hint = ""

    def greatest_sql(self, a: str, b: str) -> str:
        raise NotImplementedError

    def partition_heads_sql(self) -> str:
        """``partition_heads``: each partition of a topic with its newest offset, by a
        loose index scan of ``idx_topic_partition_offset`` (one seek per partition)."""
        raise NotImplementedError

    def partition_heads_params(self, topic: str) -> list[Any]:
        return [topic]

    def partition_heads(self, cursor: CursorWrapper, topic: str) -> dict[str, int]:
        cursor.execute(self.partition_heads_sql(), self.partition_heads_params(topic))
        return {r[0]: int(r[1]) for r in cursor.fetchall() if r[0] is not None}

    def pending_summary_sql(self, count: int, counted: bool = True) -> str:
        """``pending_summary``: for ``count`` partitions of a topic, the messages above a
        watermark, counted up to a cap (if ``counted``; replays addressed to other groups
        are counted too), and since when the group's first one is due. Each partition is
        a bounded range of ``idx_topic_partition_offset`` (at most ``cap`` index entries)
        plus a primary-key lookup of one row."""
        q = self.quote
        offset = q("offset")
        above = (f"FROM {q(MESSAGE_TABLE)} {self.offset_index_hint} WHERE {q('topic')} = %s "
                 f"AND {q('partition_key')} = %s AND {offset} > %s")
        tally = (f"(SELECT COUNT(*) FROM (SELECT 1 AS one {above} LIMIT %s) capped)"
                 if counted else "NULL")
        due = self.greatest_sql(q("created_at"), q("deliver_after"))
        # The first message for this group: replays addressed to other groups are
        # skipped (rare, so this reads one row, or a few).
        first = (f"(SELECT {due} {above} AND {q('consumer_group')} IN ('', %s) "
                 f"ORDER BY {offset} LIMIT 1)")
        return " UNION ALL ".join([f"SELECT %s, {tally}, {first}"] * count)

    def pending_summary(
        self, cursor: CursorWrapper, topic: str, group: str, watermarks: dict[str, int],
        cap: int | None,
    ) -> dict[str, PendingSummary]:
        """``watermarks``: partition key -> the offset to count above; ``cap`` None: do
        not count, only find the first pending message (for an overview)."""
        result: dict[str, PendingSummary] = {}
        keys = sorted(watermarks)
        for start in range(0, len(keys), PENDING_BRANCHES_PER_STATEMENT):
            chunk = keys[start:start + PENDING_BRANCHES_PER_STATEMENT]
            params: list[Any] = []
            for key in chunk:
                above = [topic, key, watermarks[key]]
                tally = [*above, cap] if cap is not None else []
                params += [key, *tally, *above, group]
            cursor.execute(self.pending_summary_sql(len(chunk), cap is not None), params)
            for key, count, due in cursor.fetchall():
                result[key] = PendingSummary(None if count is None else int(count),
                                             None if due is None else int(due))
        return result

    def dead_letter_counts_sql(self) -> str:
        """``dead_letter_counts``: dead letters of one group per partition of a dead-letter
        topic, counted over at most ``cap`` rows (``idx_topic_partition_offset`` range)."""
        q = self.quote
        return (
            f"SELECT {q('partition_key')}, COUNT(*) FROM (SELECT {q('partition_key')} "
            f"FROM {q(MESSAGE_TABLE)} WHERE {q('topic')} = %s AND {q('consumer_group')} = %s "
            f"LIMIT %s) capped GROUP BY {q('partition_key')}"
        )

    def dead_letter_counts(
        self, cursor: CursorWrapper, dead_letter_topic: str, group: str, cap: int
    ) -> dict[str, int]:
        cursor.execute(self.dead_letter_counts_sql(), [dead_letter_topic, group, cap])
        return {r[0]: int(r[1]) for r in cursor.fetchall()}


class Dialect(ConsumingStatements, OperatingStatements):
    """Named statements for one database vendor, bound to one connection."""

    vendor = ""
    #: SQL expression for the database clock in epoch milliseconds (one value per statement).
    now_ms_sql = ""
    #: appended to reads that must see the newest committed rows, not the snapshot
    locking_read_suffix = ""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection
        self.quote = connection.ops.quote_name

    # -- insert_messages ---------------------------------------------------------------
    #: rows per publishing INSERT; also bounded by the driver's parameter limit
    max_rows_per_insert = 500
    insert_verb = "INSERT INTO"
    _INSERT_COLUMNS = (
        "topic", "partition_key", "id", "payload", "metadata", "created_at",
        "published_at", "priority", "deliver_after",
    )

    def insert_messages_sql(self, count: int) -> str:
        """``insert_messages``: a multi-row INSERT; a duplicate key fails the statement."""
        columns = ", ".join(self.quote(c) for c in self._INSERT_COLUMNS)
        now = self.now_ms_sql
        one_row = f"(%s, %s, %s, %s, %s, {now}, %s, %s, COALESCE({now} + %s, %s))"
        values = ", ".join([one_row] * count)
        return f"{self.insert_verb} {self.quote(MESSAGE_TABLE)} ({columns}) VALUES {values}"

    @staticmethod
    def insert_messages_params(rows: Sequence[MessageRow]) -> list[Any]:
        params: list[Any] = []
        for r in rows:
            params += [r.topic, r.partition_key, r.id, r.payload, r.metadata,
                       r.published_at, r.priority, r.delay_ms, r.deliver_at_ms]
        return params

    def insert_messages(
        self, cursor: CursorWrapper, rows: Sequence[MessageRow]
    ) -> list[int] | None:
        """Insert ``rows``; return their offsets in order, or None if they cannot be known
        without reading them back.

        Raises ``IntegrityError`` if any row's (topic, partition_key, id) exists; the
        statement is then rolled back as a whole and the transaction stays usable.
        """
        cursor.execute(self.insert_messages_sql(len(rows)), self.insert_messages_params(rows))
        return self.inserted_offsets(cursor, len(rows))

    def inserted_offsets(self, cursor: CursorWrapper, count: int) -> list[int] | None:
        """The offsets the last ``insert_messages`` of ``count`` rows allocated, if known."""
        raise NotImplementedError

    # -- select_message_offsets --------------------------------------------------------
    def select_message_offsets_sql(self, count: int, *, lock: bool) -> str:
        """``select_message_offsets``: offsets of (partition_key, id) pairs of one topic.

        An OR of full-key equalities, which every vendor turns into ``count`` point
        lookups on ``idx_topic_partition_id`` (SQLite needs the topic in every term).
        """
        q = self.quote
        term = f"({q('topic')} = %s AND {q('partition_key')} = %s AND {q('id')} = %s)"
        suffix = self.locking_read_suffix if lock else ""
        return (
            f"SELECT {q('offset')}, {q('partition_key')}, {q('id')} "
            f"FROM {q(MESSAGE_TABLE)} WHERE {' OR '.join([term] * count)}{suffix}"
        )

    def select_message_offsets(
        self, cursor: CursorWrapper, topic: str, keys: Iterable[MessageKey], *, lock: bool
    ) -> dict[MessageKey, int]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        params: list[Any] = []
        for partition_key, message_id in wanted:
            params += [topic, partition_key, message_id]
        cursor.execute(self.select_message_offsets_sql(len(wanted), lock=lock), params)
        return {(pk, mid): int(offset) for offset, pk, mid in cursor.fetchall()}

    # -- database_now_ms ---------------------------------------------------------------
    def database_now_ms(self, cursor: CursorWrapper) -> int:
        """``database_now_ms``: the database clock, epoch milliseconds."""
        cursor.execute(f"SELECT {self.now_ms_sql}")
        row = cursor.fetchone()
        assert row is not None
        return int(row[0])

    # -- errors ------------------------------------------------------------------------
    def is_duplicate_message(self, error: IntegrityError) -> bool:
        """Did ``error`` come from ``idx_topic_partition_id`` (an idempotent-publish hit)?"""
        raise NotImplementedError

    def max_statement_bytes(self) -> int:
        """Upper bound for one multi-row statement's size."""
        return 8 << 20
