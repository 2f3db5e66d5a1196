"""A subscriber's watermarks: moving each partition's watermark over settled, done rows,
after sweeping the window for rows committed late (guarantee I4), and noticing one that went
back. ``Subscriber`` owns one ``WatermarkKeeper``; runs on the runner's main thread, in
its transactions.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db.backends.utils import CursorWrapper

from sqlqueue import events, storage
from sqlqueue.consuming.clock import SYSTEM_CLOCK, HostClock
from sqlqueue.consuming.outcomes import Ack
from sqlqueue.consuming.partition import PartitionState
from sqlqueue.storage.protocols import WatermarkStore

logger = logging.getLogger("sqlqueue.consumer")

SWEEP_INTERVAL = 2.0  # seconds between sweeps of a window for late-committed rows
SWEEP_LIMIT = 5000  # offsets read per sweep
WATERMARK_STEP = 0.5  # seconds between watermark writes of a partition, at most
#: Partitions whose watermark one pass moves, at most (all of them when forced, at a
#: stop). They share one sweep, one write and one delete, whose cost still grows with
#: the partitions (a range each): when the write horizon moves, every partition's
#: watermark may move at once, and 16 partitions' sweeps and writes (48 statements
#: before they were shared) held the new messages fetched in the same pass for 18 ms; the
#: rest go in the next passes, the longest unswept first.
ADVANCES_PER_PASS = 4
#: ...and in a pass that delivered messages, whose handlers wait for its commit: one. At
#: 100 messages/s on MariaDB the passes that moved 4 watermarks (12 statements more, 6-10
#: ms) were the latency's p99; the quiet passes (an outcome recorded, a poll) move the
#: rest, and under a steady stream every partition still moves one a pass.
ADVANCES_WHILE_DELIVERING = 1


class WatermarkKeeper:
    """One subscription's watermarks: when each partition's was swept and moved last,
    and the highest seen. The partitions are the subscriber's."""

    def __init__(self, *, group: str, topic: str, alias: str,
                 partitions: dict[str, PartitionState], keep_delivery_state: bool,
                 host_clock: HostClock = SYSTEM_CLOCK) -> None:
        self.host_clock = host_clock
        self.group = group
        self.topic = topic
        self.alias = alias
        self.partitions = partitions
        #: KEEP_DELIVERY_STATE: the rows' state stays until garbage collection
        self.keep_delivery_state = keep_delivery_state
        self._last_sweep: dict[str, float] = {}
        self._last_advance: dict[str, float] = {}
        # The highest watermark of each partition this process has read or written: a
        # lower one later is worth an ERROR (_check_not_back).
        self._seen_watermarks: dict[str, int] = {}

    @property
    def store(self) -> WatermarkStore:
        return storage.store(self.alias)

    def advance(
        self, cursor: CursorWrapper, settled_before: int | None, force: bool = False,
        delivering: bool = False,
    ) -> None:
        """Move each partition's watermark over settled, done rows (created before
        ``settled_before``; None: all are), after checking the window for late-committed
        rows; then drop the delivery state it covers. At most ``ADVANCES_PER_PASS``
        partitions (``ADVANCES_WHILE_DELIVERING`` when the pass is ``delivering``), but
        with ``force`` (a stop: every partition)."""
        self._advance(cursor, settled_before, force, delivering, None)

    def cover(self, cursor: CursorWrapper, settled_before: int | None,
              acks: Sequence[Ack]) -> list[Ack]:
        """Move the watermark of every partition among ``acks`` (recorded in this
        transaction but not written: done in the windows already,
        ``OutcomeRecorder.record(defer_acks=True)``), whatever the limits of ``advance``:
        a watermark written in the same transaction is their ack (a batch's acks were a
        row written a message, and a delete of it at the watermark). Returns those it did
        not cover (a message before them still open, rows not settled), for the caller to
        write in this transaction, before anything reads their rows."""
        if self.keep_delivery_state or not acks:
            # The acked rows stay until garbage collection, with their ``acked_at``.
            return list(acks)
        self._advance(cursor, settled_before, False, False,
                      {ack.partition_key for ack in acks})
        return [ack for ack in acks
                if (state := self.partitions.get(ack.partition_key)) is None
                or ack.offset > state.watermark]

    def _advance(self, cursor: CursorWrapper, settled_before: int | None, force: bool,
                 delivering: bool, only: set[str] | None) -> None:
        """``advance``; ``only``: these partitions, each checked now, none other."""
        now = self.host_clock.monotonic()
        due: list[tuple[float, str, PartitionState]] = []
        for key, state in self.partitions.items():
            if not state.window_open or (only is not None and key not in only):
                continue  # idle and settled: nothing to check, no query
            sweep_due = (force or only is not None
                         or now - self._last_sweep.get(key, 0.0) >= SWEEP_INTERVAL)
            if not sweep_due:
                if now - self._last_advance.get(key, 0.0) < WATERMARK_STEP:
                    continue  # batch watermark writes: at most one per partition per step
                # (Read only now: it sorts the window, done entries included, every pass.)
                if state.advance_candidate(settled_before) <= state.watermark:
                    continue
            due.append((self._last_sweep.get(key, 0.0), key, state))
        if not force and only is None:
            most = ADVANCES_WHILE_DELIVERING if delivering else ADVANCES_PER_PASS
            due = sorted(due, key=lambda item: item[0])[:most]
        if not due:
            return
        # One statement of each kind for every partition that moves: sweep, write, delete.
        windows = {key: (state, state.advance_candidate(settled_before))
                   for _, key, state in due}
        stored = self.store.list_offsets(
            cursor, self.topic,
            [(key, state.watermark, max(candidate, state.covered))
             for key, (state, candidate) in windows.items()],
            SWEEP_LIMIT)
        moves: list[tuple[str, int, int | None]] = []
        for key, (state, candidate) in windows.items():
            candidate = self._swept(cursor, state, candidate, settled_before, stored[key])
            self._last_sweep[key] = now
            if candidate > state.watermark:
                first_open = state.first_open()
                moves.append((key, candidate, first_open if first_open is not None
                              and first_open > candidate else None))
        self.store.advance_watermarks(cursor, self.group, self.topic, moves)
        # Only once the watermarks are written may the state behind them go (or, with
        # KEEP_DELIVERY_STATE, with its message, at garbage collection).
        if not self.keep_delivery_state:
            self.store.delete_states_upto(cursor, self.group, self.topic,
                                            [(key, upto) for key, upto, _ in moves])
        for key, upto, _ in moves:
            self.partitions[key].moved_watermark(upto)
            self._seen_watermarks[key] = upto
            self._last_advance[key] = now

    def _swept(
        self, cursor: CursorWrapper, state: PartitionState, candidate: int,
        settled_before: int | None, stored: list[int],
    ) -> int:
        """The candidate, after taking in the rows of the window (``stored``: the offsets
        the sweep read) that were committed after the fetch passed them."""
        unknown = [o for o in stored if o not in state.entries]
        if unknown:
            rows = self.store.fetch_messages_at(
                cursor, self.group, self.topic, state.partition_key, unknown
            )
            for entry in state.absorb(rows, self.group):
                logger.info("Found late-committed message %s/%s@%s for group %r.",
                            self.topic, state.partition_key, entry.offset, self.group)
            candidate = state.advance_candidate(settled_before)
        if len(stored) == SWEEP_LIMIT:
            candidate = min(candidate, stored[-1])  # only checked up to there
        return candidate

    def check_not_back(self, key: str, watermark: int) -> None:
        """A watermark only moves forward, but for an operator's reset-position or writes
        the database lost (a failover to a replica that was behind, a restore): say so,
        as the messages in between are delivered again."""
        seen = self._seen_watermarks.get(key, 0)
        if watermark < seen:
            logger.error(
                "The watermark of %s on %s/%s went back from %d to %d: an operator reset it "
                "(queue reset-position), or the database lost writes (a failover to a "
                "replica that was behind, a restore). Messages in between are delivered "
                "again.", self.group, self.topic, key, seen, watermark,
                extra=events.fields(events.WATERMARK_WENT_BACK, group=self.group,
                                    topic=self.topic, partition=key, seen=seen,
                                    now=watermark))
        self._seen_watermarks[key] = watermark

