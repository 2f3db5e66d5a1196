"""``MemoryStore``: the queue's named statements on a ``MemoryDatabase``, with the
semantics of the SQL in ``sqlqueue.storage.statements`` (delivery, watermarks,
publishing; membership in ``membership``). A ``Dialect``, so that whatever the engine
calls and this class lacks reaches the cursor, which runs no SQL and names the statement.

Time is the database's: ``now_ms`` of the ``MemoryDatabase``, the clock the harness
injects into the runners too (guarantee I11 then holds by construction).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError

from sqlqueue.horizon import WriteHorizon
from sqlqueue.storage.sql.base import Dialect, OpenWriter
from sqlqueue.storage.sql.tables import FetchedRow, IdempotencyDigest, MessageKey, MessageRow
from sqlqueue.storage.statements.delivery import OutcomeWrite
from sqlqueue.storage.statements.vendors import Statement
from tests.engine.memory.membership import MembershipStatements
from tests.engine.memory.tables import (
    DeliveryRow,
    MemoryDatabase,
    StoredMessage,
    Tables,
    WatermarkRow,
)

if TYPE_CHECKING:
    from tests.engine.memory.base import DatabaseWrapper


class DuplicateMessage(IntegrityError):
    """idx_topic_partition_id: the (topic, partition_key, id) is stored already."""


class MemoryStore(MembershipStatements, Dialect):
    vendor = "memory"

    def __init__(self, connection: DatabaseWrapper) -> None:  # no SQL statements to build
        self.connection = self.wrapper = connection
        self.quote = connection.ops.quote_name

    @property
    def database(self) -> MemoryDatabase:
        return self.wrapper.database

    def _tables(self, statement: str) -> Tables:
        self.connection.ensure_connection()
        return self.database.use(self.connection.connection, statement)

    def _now(self) -> int:
        return self.database.now_ms()

    # -- the server and its sessions -------------------------------------------------------------
    def database_now_ms(self, cursor: Any) -> int:
        return self._now()

    def head_and_server(self, cursor: Any) -> tuple[int, str]:
        messages = self._tables("head_offset").messages
        return (max(messages) if messages else 0), self.server_identity(cursor)

    def write_horizon(self, cursor: Any) -> WriteHorizon | None:
        """None: one transaction at a time, nothing commits out of offset order; unless
        a test holds publishes back (late commits, ``MemoryDatabase.open_writers``):
        then exactly what is open, as PostgreSQL shows it."""
        writers = self.database.open_writers
        if writers is None:
            return None
        return WriteHorizon(min(writers.values(), default=None), self._now(), 0)

    def oldest_writer(self, cursor: Any) -> OpenWriter | None:
        """A late commit the test holds back (no session of its own), or None."""
        writers, now = self.database.open_writers, self._now()
        if not writers:
            return None
        started = min(writers.values())
        return OpenWriter("test", "", started, None, "held back by the test", "", now - started)

    def bound_lock_waits(self, cursor: Any, seconds: int) -> None:
        pass  # no locks to wait for

    def bound_transaction_lock_waits(self, seconds: int) -> Statement | None:
        return None

    def bound_idle_transactions(self, cursor: Any, milliseconds: int) -> bool:
        return False  # nothing ends a session here: a stepped runner never freezes in one

    def offset_counter(self, cursor: Any) -> int | None:
        return self.database.next_offset

    def delete_minute_stats(self, cursor: Any, keep_ms: int) -> int:
        return 0  # the live overview's rows are not modelled: none to prune

    # -- publishing ------------------------------------------------------------------------------
    def insert_messages(self, cursor: Any, rows: Sequence[MessageRow], *,
                        wake: str | None = None, prepared: bool = False) -> list[int] | None:
        """All rows or none: a (topic, partition_key, id) stored already fails the
        statement (``DuplicateMessage``)."""
        t, now = self._tables("insert_messages"), self._now()
        keys = [(r.topic, r.partition_key, r.id) for r in rows]
        if len(set(keys)) < len(keys) or any(key in t.message_ids for key in keys):
            raise DuplicateMessage("duplicate key value violates idx_topic_partition_id")
        offsets = []
        for row in rows:
            offset = self.database.allocate_offset()
            deliver_after = now + row.delay_ms if row.delay_ms is not None else row.deliver_at_ms
            t.messages[offset] = StoredMessage(
                offset, row.topic, row.partition_key, row.id, bytes(row.payload), row.metadata,
                now, row.published_at, row.priority, deliver_after)
            t.message_ids[(row.topic, row.partition_key, row.id)] = offset
            offsets.append(offset)
        return offsets

    def is_duplicate_message(self, error: IntegrityError) -> bool:
        return isinstance(error, DuplicateMessage)

    def select_message_offsets(self, cursor: Any, topic: str, keys: Iterable[MessageKey], *,
                               lock: bool) -> dict[MessageKey, int]:
        ids = self._tables("select_message_offsets").message_ids
        return {(pk, mid): ids[(topic, pk, mid)] for pk, mid in keys if (topic, pk, mid) in ids}

    def select_idempotency_keys(self, cursor: Any, digests: Sequence[IdempotencyDigest], *,
                                lock: bool) -> dict[IdempotencyDigest, int]:
        t, now = self._tables("select_idempotency_keys"), self._now()
        return {d: t.idempotency[d][0] for d in digests
                if d in t.idempotency and t.idempotency[d][1] > now}

    def remember_idempotency_keys(self, cursor: Any, keys: Sequence[tuple[int, int, int]],
                                  window_ms: int) -> None:
        t, now = self._tables("remember_idempotency_keys"), self._now()
        for high, low, offset in keys:
            t.idempotency[(high, low)] = (offset, now + window_ms)

    def delete_expired_idempotency_keys(self, cursor: Any, limit: int) -> int:
        t, now = self._tables("delete_expired_idempotency_keys"), self._now()
        expired = sorted((d for d, (_, expires) in t.idempotency.items() if expires <= now),
                         key=lambda d: t.idempotency[d][1])[:limit]
        for digest in expired:
            del t.idempotency[digest]
        return len(expired)

    # -- reads of a partition ---------------------------------------------------------------
    def _partition(self, t: Tables, topic: str, partition: str) -> list[StoredMessage]:
        return [m for m in t.messages.values()
                if m.topic == topic and m.partition_key == partition]

    def _row_of(self, t: Tables, group: str, m: StoredMessage) -> FetchedRow:
        state = t.states.get((group, m.topic, m.partition_key, m.offset))
        return FetchedRow(
            offset=m.offset, id=m.id, payload=m.payload, metadata=m.metadata,
            created_at=m.created_at, published_at=m.published_at, priority=m.priority,
            deliver_after=m.deliver_after, consumer_group=m.consumer_group,
            failure_detail=m.failure_detail,
            acked=None if state is None else state.acked,
            invisible_until=None if state is None else state.invisible_until,
            retry_count=None if state is None else state.retry_count)

    def fetch_messages(self, cursor: Any, group: str, topic: str, partition: str,
                       after: int, limit: int) -> list[FetchedRow]:
        t = self._tables("fetch_messages")
        rows = [m for m in self._partition(t, topic, partition) if m.offset > after][:limit]
        return [self._row_of(t, group, m) for m in rows]

    def fetch_partitions(self, cursor: Any, group: str, topic: str,
                         positions: Sequence[tuple[str, int]],
                         limit: int) -> dict[str, list[FetchedRow]]:
        return {p: self.fetch_messages(cursor, group, topic, p, after, limit)
                for p, after in positions}

    def partitions_with_rows(self, cursor: Any, topic: str, after: int,
                             upto: int) -> set[str]:
        t = self._tables("partitions_with_rows")
        return {m.partition_key for m in t.messages.values()
                if m.topic == topic and after < m.offset <= upto}

    def fetch_messages_at(self, cursor: Any, group: str, topic: str, partition: str,
                          offsets: Sequence[int]) -> list[FetchedRow]:
        t = self._tables("fetch_messages_at")
        return [self._row_of(t, group, m) for m in self._partition(t, topic, partition)
                if m.offset in set(offsets)]

    def list_offsets(self, cursor: Any, topic: str, windows: Sequence[tuple[str, int, int]],
                     limit: int) -> dict[str, list[int]]:
        t = self._tables("list_offsets")
        return {partition: [m.offset for m in self._partition(t, topic, partition)
                            if after < m.offset <= upto][:limit]
                for partition, after, upto in windows}

    def runs_in_flight(self, cursor: Any, group: str, topic: str,
                       windows: Sequence[tuple[str, int]]) -> dict[str, int]:
        t, now = self._tables("runs_in_flight"), self._now()
        found: dict[str, int] = {}
        for partition, watermark in windows:
            untils = [state.invisible_until for (g, tp, p, offset), state in t.states.items()
                      if (g, tp, p) == (group, topic, partition) and offset > watermark
                      and not state.acked and state.invisible_until > now]
            if untils:
                found[partition] = max(untils)
        return found

    def discover_partitions(self, cursor: Any, topic: str) -> list[str]:
        t = self._tables("discover_partitions")
        return sorted({m.partition_key for m in t.messages.values() if m.topic == topic})

    # -- delivery state --------------------------------------------------------------------------
    def mark_delivered(self, cursor: Any, group: str, topic: str,
                       deliveries: Sequence[tuple[str, int, int]]) -> None:
        """Start the visibility clock and charge an attempt; an acked row is untouched."""
        t = self._tables("mark_delivered")
        for partition, offset, invisible_until in deliveries:
            key = (group, topic, partition, offset)
            state = t.states.get(key)
            if state is None:
                t.states[key] = DeliveryRow(False, invisible_until, 0)
            elif not state.acked:
                t.states[key] = dataclasses.replace(
                    state, invisible_until=invisible_until, retry_count=state.retry_count + 1)

    def write_outcomes(self, cursor: Any, group: str, topic: str,
                       writes: Sequence[OutcomeWrite]) -> None:
        """Acks and scheduled retries; an acked row stays acked, as it was."""
        t, now = self._tables("write_outcomes"), self._now()
        for w in writes:
            key = (group, topic, w.partition_key, w.offset)
            state = t.states.get(key)
            if state is not None and state.acked:
                continue
            t.states[key] = DeliveryRow(
                w.acked, w.invisible_until, 0 if state is None else state.retry_count,
                now if w.acked else 0, w.last_error)

    def give_back(self, cursor: Any, group: str, topic: str, partition: str, offset: int,
                  previous_retry_count: int | None) -> None:
        t = self._tables("give_back")
        key = (group, topic, partition, offset)
        state = t.states.get(key)
        if state is None or state.acked:
            return
        if previous_retry_count is None:
            del t.states[key]
        else:
            t.states[key] = dataclasses.replace(state, invisible_until=0,
                                                retry_count=previous_retry_count)

    def extend_visibility(self, cursor: Any, group: str, topic: str, partition: str,
                          offset: int, milliseconds: int) -> int:
        t, now = self._tables("extend_visibility"), self._now()
        key = (group, topic, partition, offset)
        state = t.states.get(key)
        if state is None or state.acked:
            return 0
        t.states[key] = dataclasses.replace(state, invisible_until=now + milliseconds)
        return 1

    # -- watermarks ------------------------------------------------------------------------------
    def ensure_watermark(self, cursor: Any, group: str, topic: str, partition: str) -> int:
        t = self._tables("ensure_watermarks")
        row = t.watermarks.setdefault((group, topic, partition), WatermarkRow(0, self._now()))
        return row.offset_acked

    def start_at_heads(self, cursor: Any, group: str, topic: str) -> int:
        t = self._tables("start_at_heads")
        if any(key[:2] == (group, topic) for key in t.watermarks):
            return 0
        heads: dict[str, int] = {}
        for m in t.messages.values():
            if m.topic == topic:
                heads[m.partition_key] = max(heads.get(m.partition_key, 0), m.offset)
        for partition, head in heads.items():
            t.watermarks[(group, topic, partition)] = WatermarkRow(head, self._now())
        return len(heads)

    def advance_watermarks(self, cursor: Any, group: str, topic: str,
                           moves: Sequence[tuple[str, int, int | None]]) -> int:
        """Forward only."""
        t = self._tables("advance_watermarks")
        moved = 0
        for partition, upto, first_pending in moves:
            key = (group, topic, partition)
            row = t.watermarks.get(key)
            if row is None or row.offset_acked >= upto:
                continue
            t.watermarks[key] = WatermarkRow(upto, self._now(), first_pending)
            moved += 1
        return moved

    def delete_states_upto(self, cursor: Any, group: str, topic: str,
                           limits: Sequence[tuple[str, int]]) -> int:
        t = self._tables("delete_states_upto")
        upto_of = dict(limits)
        gone = [key for key in t.states
                if key[:2] == (group, topic) and key[2] in upto_of
                and key[3] <= upto_of[key[2]]]
        for key in gone:
            del t.states[key]
        return len(gone)

    def topic_watermarks(self, cursor: Any, topic: str,
                         ) -> tuple[set[str], dict[str, dict[str, int]]]:
        t = self._tables("topic_watermarks")
        groups: set[str] = set()
        partitions: dict[str, dict[str, int]] = {}
        for (group, row_topic, partition), row in t.watermarks.items():
            if row_topic == topic:
                groups.add(group)
                partitions.setdefault(partition, {})[group] = row.offset_acked
        return groups, partitions

    # -- dead letters, replays, garbage collection ------------------------------------------------
    def insert_dead_letter(self, cursor: Any, *, dead_letter_topic: str, dead_letter_id: str,
                           offset: int, attempts: int, last_error: str, detail: str,
                           group: str) -> None:
        """A copy of the message at ``offset`` in the dead-letter topic for ``group``; the
        same dead letter again updates its failure columns."""
        t, now = self._tables("insert_dead_letter"), self._now()
        original = t.messages.get(offset)
        if original is None:
            return
        key = (dead_letter_topic, original.partition_key, dead_letter_id)
        failure = {"failed_at": now, "failure_count": attempts, "last_error": last_error,
                   "failure_detail": detail}
        if key in t.message_ids:
            stored = t.messages[t.message_ids[key]]
            t.messages[stored.offset] = dataclasses.replace(stored, **failure)  # type: ignore[arg-type]
            return
        new = self.database.allocate_offset()
        t.messages[new] = dataclasses.replace(
            original, offset=new, topic=dead_letter_topic, id=dead_letter_id,
            created_at=now, deliver_after=0, original_topic=original.topic,
            consumer_group=group,
            **failure)  # type: ignore[arg-type]
        t.message_ids[key] = new

    def insert_replay(self, cursor: Any, *, dead_letter_offset: int, replay_id: str,
                      detail: str) -> int:
        t, now = self._tables("insert_replay"), self._now()
        letter = t.messages[dead_letter_offset]
        key = (letter.original_topic, letter.partition_key, replay_id)
        if key in t.message_ids:
            raise DuplicateMessage("duplicate key value violates idx_topic_partition_id")
        new = self.database.allocate_offset()
        t.messages[new] = StoredMessage(
            new, letter.original_topic, letter.partition_key, replay_id, letter.payload,
            letter.metadata, now, letter.published_at, letter.priority, 0,
            consumer_group=letter.consumer_group, failure_detail=detail)
        t.message_ids[key] = new
        return new

    def delete_messages_upto(self, cursor: Any, topic: str, partition: str, upto: int,
                             limit: int) -> int:
        t = self._tables("delete_messages_upto")
        gone = [m for m in self._partition(t, topic, partition) if m.offset <= upto][:limit]
        for m in gone:
            del t.messages[m.offset]
            del t.message_ids[(m.topic, m.partition_key, m.id)]
        return len(gone)
