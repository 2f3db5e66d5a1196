"""``MemoryStore``: the engine's protocols (``sqlqueue.storage.protocols.EngineStore``)
on a ``MemoryDatabase``, with the semantics of the SQL in ``sqlqueue.storage.statements``
(delivery, watermarks, garbage collection, the minute rollup here; publishing in
``publishing``, membership in ``membership``). Not a ``Store``: what the engine needs and
this class lacks is a type error (mypy checks it where ``base.DatabaseWrapper`` hands it
out), and tests/integration/test_memory_store_parity.py runs every method of every
engine protocol on it and on the real database.

Time is the database's: ``now_ms`` of the ``MemoryDatabase``, the clock the harness
injects into the runners too (guarantee I11 then holds by construction).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sqlqueue.horizon import WriteHorizon
from sqlqueue.storage.sql.minute_stats import MinuteCounts
from sqlqueue.storage.sql.sessions import OpenWriter
from sqlqueue.storage.sql.tables import FetchedRow
from sqlqueue.storage.statements.dead_letters import DeadLetterWrite
from sqlqueue.storage.statements.delivery import OutcomeWrite
from sqlqueue.storage.statements.vendors import Statement
from tests.engine.memory.membership import MemoryMembership
from tests.engine.memory.publishing import MemoryDuplicateMessage, MemoryPublishing
from tests.engine.memory.tables import DeliveryRow, StoredMessage, Tables, WatermarkRow


class MemoryStore(MemoryPublishing, MemoryMembership):
    """The in-memory database's store: ``EngineStore``."""

    #: one UNION of fetches costs nothing to plan here: no partitions left out
    narrows_fetches = False

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

    def through_pooler(self, cursor: Any) -> bool:
        return False

    def notify_heartbeat(self, cursor: Any) -> None:
        pass

    def offset_counter(self, cursor: Any) -> int | None:
        return self.database.next_offset

    # -- the live overview's minute rollup ----------------------------------------------------
    def add_minute_stats(self, cursor: Any, counts: MinuteCounts) -> None:
        """Add to each (group, topic, minute) row, creating it (every column starts at 0)."""
        t = self._tables("add_minute_stats")
        for key, columns in counts.items():
            row = t.minute_stats.get(key, {})
            t.minute_stats[key] = {**row, **{c: row.get(c, 0) + v for c, v in columns.items()}}

    def read_minute_stats(self, cursor: Any, since: int,
                          columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
        t = self._tables("read_minute_stats")
        return [(*key, *(row.get(c, 0) for c in columns))
                for key, row in sorted(t.minute_stats.items()) if key[2] >= since]

    def delete_minute_stats(self, cursor: Any, keep_ms: int) -> int:
        t, now = self._tables("delete_minute_stats"), self._now()
        gone = [key for key in t.minute_stats if key[2] < now - keep_ms]
        for key in gone:
            del t.minute_stats[key]
        return len(gone)

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

    def give_back(self, cursor: Any, group: str, topic: str, keys: Sequence[tuple[str, int]],
                  previous_retry_count: int | None) -> None:
        t = self._tables("give_back")
        for partition, offset in keys:
            key = (group, topic, partition, offset)
            state = t.states.get(key)
            if state is None or state.acked:
                continue
            if previous_retry_count is None:
                del t.states[key]
            else:
                t.states[key] = dataclasses.replace(state, invisible_until=0,
                                                    retry_count=previous_retry_count)

    def ack_deliveries(self, cursor: Any, group: str, topic: str,
                       deliveries: Sequence[tuple[str, int, int]]) -> int:
        """Acks fenced on the delivery: only a row whose retry count is unchanged (an
        acked one stays as it was); returns the rows matched."""
        t, now = self._tables("ack_deliveries"), self._now()
        matched = 0
        for partition, offset, retry_count in deliveries:
            key = (group, topic, partition, offset)
            state = t.states.get(key)
            if state is None or state.retry_count != retry_count:
                continue
            matched += 1
            if not state.acked:
                t.states[key] = dataclasses.replace(state, acked=True, invisible_until=0,
                                                    acked_at=now, last_error="")
        return matched

    def acked_among(self, cursor: Any, group: str, topic: str,
                    pairs: Sequence[tuple[str, int]], lock: bool = False
                    ) -> set[tuple[str, int]]:
        t = self._tables("acked_among")  # one process: no lock to take
        return {(partition, offset) for partition, offset in pairs
                if (state := t.states.get((group, topic, partition, offset))) is not None
                and state.acked}

    def extend_visibility(self, cursor: Any, group: str, topic: str, partition: str,
                          offset: int, milliseconds: int) -> int:
        t, now = self._tables("extend_visibility"), self._now()
        key = (group, topic, partition, offset)
        state = t.states.get(key)
        if state is None or state.acked:
            return 0
        t.states[key] = dataclasses.replace(state, invisible_until=now + milliseconds)
        return 1

    def restamp_visibility(self, cursor: Any, group: str, topic: str,
                           pairs: Sequence[tuple[str, int]], milliseconds: int) -> None:
        t, now = self._tables("restamp_visibility"), self._now()
        for partition, offset in pairs:
            key = (group, topic, partition, offset)
            state = t.states.get(key)
            if state is not None and not state.acked:
                t.states[key] = dataclasses.replace(state, invisible_until=now + milliseconds)

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
    def insert_dead_letters(self, cursor: Any, *, dead_letter_topic: str, group: str,
                            letters: Sequence[DeadLetterWrite]) -> None:
        """Copies of the messages at the letters' offsets in the dead-letter topic for
        ``group``, in offset order; the same dead letter again updates its failure
        columns."""
        t, now = self._tables("insert_dead_letters"), self._now()
        for letter in sorted(letters, key=lambda w: w.offset):
            original = t.messages.get(letter.offset)
            if original is None:
                continue
            key = (dead_letter_topic, original.partition_key, letter.dead_letter_id)
            failure = {"failed_at": now, "failure_count": letter.attempts,
                       "last_error": letter.last_error, "failure_detail": letter.detail}
            if key in t.message_ids:
                stored = t.messages[t.message_ids[key]]
                t.messages[stored.offset] = dataclasses.replace(stored, **failure)  # type: ignore[arg-type]
                continue
            new = self.database.allocate_offset()
            t.messages[new] = dataclasses.replace(
                original, offset=new, topic=dead_letter_topic, id=letter.dead_letter_id,
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
            raise MemoryDuplicateMessage("duplicate key value violates idx_topic_partition_id")
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

    def delete_messages_in_window(self, cursor: Any, topic: str, after: int, upto: int,
                                  limits: Sequence[tuple[str, int]]) -> int:
        """The rows of ``topic`` with after < offset <= upto, each at or below its
        partition's limit; a partition not named keeps its rows."""
        t = self._tables("delete_messages_in_window")
        limit_of = dict(limits)
        gone = [m for m in t.messages.values()
                if m.topic == topic and after < m.offset <= upto
                and m.offset <= limit_of.get(m.partition_key, after)]
        for m in gone:
            del t.messages[m.offset]
            del t.message_ids[(m.topic, m.partition_key, m.id)]
        return len(gone)

    def first_offsets_above(self, cursor: Any, topic: str,
                            pairs: Sequence[tuple[str, int]]) -> list[int | None]:
        """For each (partition, watermark), the first stored offset above it."""
        t = self._tables("first_offsets_above")
        return [min((m.offset for m in self._partition(t, topic, partition)
                     if m.offset > watermark), default=None)
                for partition, watermark in pairs]
