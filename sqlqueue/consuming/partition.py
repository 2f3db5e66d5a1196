"""In-memory bookkeeping of one partition for one consumer group. No I/O here.

Offsets of the partition fall in three zones::

    ... done ... | watermark W | window: fetched, not all done | fetched_upto F | not fetched

* Everything at or below ``W`` (the durable watermark, ``queue_offsets.offset_acked``) is
  finished for the group and can never change.
* ``entries`` holds every row fetched above ``W``: done (acked or dead-lettered) or open
  (waiting, due, in flight, backing off, scheduled).
* ``W`` moves over a done row only once the row is *settled*: no publishing transaction
  that could still commit a row below it is open (the write horizon). Rows committed
  late, below rows already fetched, are found by sweeping the window (late commits,
  guarantee I4).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from operator import attrgetter

from sqlqueue.exceptions import SqlqueueError
from sqlqueue.storage.sql.base import FetchedRow

#: The environment variable that has every window (``PartitionState``) checked for one
#: writer thread: the tests set it (tests/conftest.py, read when a state is made, as the
#: engine may be imported before); a process serving messages does not pay for a
#: thread-identity read on every change of a window.
CHECK_WRITER_VARIABLE = "SQLQUEUE_CHECK_WRITER"


#: the order ``ready`` hands entries out in: priority, then offset
_BEST_FIRST = attrgetter("priority", "offset")


def _writer_to_check() -> int | None:
    """The thread making a window, if windows are checked (None: not checked)."""
    return threading.get_ident() if os.environ.get(CHECK_WRITER_VARIABLE) == "1" else None


class WindowWrittenElsewhere(SqlqueueError):
    """A partition's window was changed on a thread other than its writer's (a bug:
    handler threads never write it, ``Hold``)."""


class Hold:
    """How far ``extend_visibility()`` pushed one delivery's visibility timeout back (the
    clock's estimate, database time). Its handler thread is its one writer; the main
    thread only reads it, through the delivery's ``Entry``.

    Why a cell of the delivery's and not a change of the window posted to the main
    thread: the hold must keep the delivery from being delivered again by this process
    at once (the handler's own ``may_start`` and the main thread's next judgement of
    expiry alike, guarantee I10), not from the main thread's next pass on; and a cell
    made for one delivery cannot extend another attempt of the same message."""

    __slots__ = ("until_ms",)

    def __init__(self) -> None:
        self.until_ms = 0

    def push_back(self, until_ms: int) -> None:
        """On the delivery's handler thread only (a single int store: no lock needed)."""
        self.until_ms = max(self.until_ms, until_ms)


@dataclass
class Entry:
    offset: int
    created_at: int
    priority: int
    row: FetchedRow | None  # dropped once done, to keep only what the watermark needs
    done: bool = False
    in_flight: bool = False
    visible_again_ms: int = 0  # while in flight: its visibility timeout, database time
    #: ... pushed back by extend_visibility: the current delivery's (its handler writes it)
    hold: Hold = field(default_factory=Hold)
    due_ms: int = 0  # not delivered before this database time
    retry_count: int | None = None  # the state row's, None while never delivered
    previous_retry_count: int | None = None  # before the current delivery (give-back)

    @property
    def attempt(self) -> int:
        return (self.retry_count or 0) + 1

    @property
    def held_until_ms(self) -> int:
        """Its timeout as ``extend_visibility`` pushed it back (0: not extended)."""
        return self.hold.until_ms


@dataclass
class PartitionState:
    partition_key: str
    watermark: int
    fetched_upto: int = 0  # the highest offset read into the window
    covered: int = 0  # every offset up to here was below the head at some fetch ...
    covered_at_ms: int = 0  # ... at this database time
    exhausted: bool = False  # the last fetch found the end of the partition
    entries: dict[int, Entry] = field(default_factory=dict)
    tenure: int | None = None  # of the lease this state was built under (leases.Lease)
    #: runs still going of messages already done (a late ack of an attempt that a
    #: redelivery overtook finished them): offset -> (that run's attempt, its timeout)
    overtaken_runs: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: ordered: a delivery made under an earlier lease of the partition (a holder that
    #: lost it, frozen or cut off, whose handler may still run) is in flight until this
    #: database time: nothing starts before (``runs_in_flight``, read when the lease was
    #: taken; guarantee I5)
    earlier_runs_until_ms: int = 0
    #: the thread that made it, its one writer (the runner's main thread; None: not
    #: checked, CHECK_WRITER_VARIABLE)
    writer: int | None = field(default_factory=_writer_to_check, repr=False, compare=False)
    #: the entries not done, by offset: what the scans of open work read (not the done
    #: ones waiting for the watermark: hundreds a partition in a drain)
    open_entries: dict[int, Entry] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.fetched_upto = max(self.fetched_upto, self.watermark)
        self.covered = max(self.covered, self.watermark)

    def _writing(self) -> None:
        """Every change of the window goes through a method that calls this first: one
        thread writes it (the parts of its Subscriber on the main thread: the table "Who
        changes a window" in docs/internals.md)."""
        if self.writer is not None and threading.get_ident() != self.writer:
            raise WindowWrittenElsewhere(
                f"The window of partition {self.partition_key!r} was changed on thread "
                f"{threading.current_thread().name!r}, not on the thread that owns it.")

    # -- what was read ----------------------------------------------------------------
    def absorb(self, rows: Iterable[FetchedRow], group: str) -> list[Entry]:
        """Add fetched rows; return the new entries (rows already known are ignored)."""
        self._writing()
        added = []
        for row in rows:
            if row.offset <= self.watermark or row.offset in self.entries:
                continue
            entry = Entry(row.offset, row.created_at, row.priority, row)
            if row.consumer_group not in ("", group) or row.acked:
                # Addressed to another group (a replay), or already acked for us.
                entry.done, entry.row = True, None
            else:
                entry.retry_count = row.retry_count
                entry.due_ms = max(row.deliver_after, row.invisible_until or 0)
            self.entries[row.offset] = entry
            if not entry.done:
                self.open_entries[row.offset] = entry
            added.append(entry)
            self.fetched_upto = max(self.fetched_upto, row.offset)
        return added

    @property
    def open_count(self) -> int:
        return len(self.open_entries)

    @property
    def in_flight_count(self) -> int:
        return sum(1 for e in self.open_entries.values() if e.in_flight)

    def wants_fetch(self, batch_size: int, head: Callable[[], int]) -> bool:
        """Read more when the buffer is at most half full and there may be new rows
        (``head``, the log's newest offset, is read only when that is the question)."""
        if not self.has_room(batch_size):
            return False
        return not (self.exhausted and head() <= self.covered)

    def has_room(self, batch_size: int) -> bool:
        """The buffer is at most half open: worth reading more into."""
        return self.open_count <= batch_size // 2

    def reads_on(self, batch_size: int) -> bool:
        """The last fetch was full yet left the buffer at most half open: its rows were
        mostly done already (acked by the partition's previous holder, a crashed or
        rebalanced subscriber, above the durable watermark it had not yet moved; or
        addressed to another group). There is more behind them to read now, not at the
        next poll."""
        return not self.exhausted and self.has_room(batch_size)

    def fetched(self, rows_returned: int, limit: int, head: Callable[[], int],
                now_ms: int) -> None:
        self._writing()
        self.exhausted = rows_returned < limit
        if self.exhausted and max(head(), self.fetched_upto) > self.covered:
            self.covered = max(head(), self.fetched_upto)
            self.covered_at_ms = now_ms

    # -- what to deliver ----------------------------------------------------------------
    def ready(self, now_ms: int, batch_size: int, ordered: bool,
              answered: Container[int] = (), run: int = 1) -> list[Entry]:
        """Entries to hand to handlers now, best first. ``answered``: offsets whose
        handler has finished (or timed out) with an outcome not recorded yet: not
        delivered again until it is (never because the main thread was slow to record
        it, guarantee I5). ``run``: ordered, how many consecutive messages one handler
        call takes (a batch consumer's ``max_batch``)."""
        if ordered:
            head = self._next_in_order(now_ms, answered)
            return self._run_from(head[0], now_ms, answered, run) if head and run > 1 else head
        due = [e for e in self.open_entries.values() if e.offset not in answered
               and (self.overdue(e, now_ms) if e.in_flight else e.due_ms <= now_ms)]
        room = batch_size - self.in_flight_count + sum(1 for e in due if e.in_flight)
        if room <= 0:
            return []
        due.sort(key=_BEST_FIRST)
        return due[:room]

    def _next_in_order(self, now_ms: int, answered: Container[int]) -> list[Entry]:
        """One run at a time, in offset order. Nothing starts while a delivery of the
        partition is in flight and within its visibility timeout: a message committed
        late, below it (found by a sweep), waits for that run to end instead of running
        beside it (guarantee I5). The same for a delivery made under an earlier lease,
        whose run may go on in a holder that lost the lease (``earlier_runs_until_ms``):
        a message found late below it waits too, as the next one in order does. Then
        the first open entry holds the partition."""
        if now_ms < self.earlier_runs_until_ms:
            return []
        if any(e.in_flight and not self._redeliverable(e, now_ms, answered)
               for e in self.open_entries.values()) or self._overtaken_run_going(now_ms):
            return []
        head = self.open_entries.get(min(self.open_entries, default=-1))
        if (head is None or head.offset in answered
                or (not head.in_flight and head.due_ms > now_ms)):
            return []
        return [head]

    def _run_from(self, head: Entry, now_ms: int, answered: Container[int],
                  run: int) -> list[Entry]:
        """``head`` and the open entries after it in offset order, up to ``run`` of them,
        as far as each is due and not in flight: consecutive messages of the partition
        for one batch call (nothing else of it is in flight: ``_next_in_order``)."""
        taken = [head]
        for offset in sorted(o for o in self.open_entries if o > head.offset):
            entry = self.open_entries[offset]
            if (len(taken) == run or entry.in_flight or entry.due_ms > now_ms
                    or offset in answered):
                break
            taken.append(entry)
        return taken

    def wait_for_earlier_runs(self, until_ms: int) -> None:
        """Ordered: a delivery made under an earlier lease may run until ``until_ms``
        (``EarlierRuns``): nothing starts before."""
        self._writing()
        self.earlier_runs_until_ms = until_ms

    def _overtaken_run_going(self, now_ms: int) -> bool:
        """A run of a message already done is still within its visibility timeout (its
        entry may be gone already: the watermark passed it)."""
        if not self.overtaken_runs:
            return False  # nearly always: no allocation on every poll
        self._writing()
        self.overtaken_runs = {offset: run for offset, run in self.overtaken_runs.items()
                               if run[1] > now_ms}
        return bool(self.overtaken_runs)

    def _redeliverable(self, entry: Entry, now_ms: int, answered: Container[int]) -> bool:
        """In flight past its visibility timeout, and its handler has not answered."""
        return self.overdue(entry, now_ms) and entry.offset not in answered

    @staticmethod
    def overdue(entry: Entry, now_ms: int) -> bool:
        """In flight past its visibility timeout (and not extended): its handler hangs or
        died, and the message may be delivered again (at least once, guarantee I10)."""
        return (entry.in_flight and 0 < entry.visible_again_ms <= now_ms
                and now_ms >= entry.held_until_ms)

    def next_due_ms(self, batch_size: int, ordered: bool) -> int | None:
        """When the earliest waiting entry becomes deliverable (None: nothing waits). With
        no room for another run (ordered: one in flight; unordered: ``batch_size``), not
        before the first run's timeout ends: only an outcome makes room sooner, and it
        wakes the runner itself. ("Due now" made the runner pass back to back while the
        runs went on: a third of a core for one slow ordered handler.)"""
        waiting = [e.due_ms for e in self.open_entries.values() if not e.in_flight]
        if not waiting:
            return None
        # (Set in ordered partitions only, where it holds every one of them back.)
        due = max(min(waiting), self.earlier_runs_until_ms)
        running = [max(e.visible_again_ms, e.held_until_ms)
                   for e in self.open_entries.values() if e.in_flight]
        if running and (ordered or len(running) >= batch_size):
            due = max(due, min(running))
        return due

    def dispatched(self, entry: Entry, visible_again_ms: int = 0,
                   hold: Hold | None = None) -> None:
        """Delivered now, until ``visible_again_ms``; ``hold``: the new delivery's, which
        its handler extends (a new one each delivery: an earlier attempt's handler cannot
        extend this one)."""
        self._writing()
        entry.in_flight = True
        entry.visible_again_ms = visible_again_ms
        entry.hold = hold or Hold()
        entry.previous_retry_count = entry.retry_count
        entry.retry_count = 0 if entry.retry_count is None else entry.retry_count + 1

    def adopt(self, entry: Entry, hold: Hold) -> None:
        """``entry``, read again from the database while its latest delivery is still
        this process's (queued or running; ``hold``: that delivery's), is in flight, as
        before the view was rebuilt."""
        self._writing()
        entry.in_flight = True
        entry.visible_again_ms = entry.due_ms
        entry.hold = hold
        entry.previous_retry_count = entry.retry_count - 1 if entry.retry_count else None

    def visible_again_at(self, entry: Entry, ms: int) -> None:
        """``entry``'s visibility timeout was stamped again (still queued: database
        time)."""
        self._writing()
        entry.visible_again_ms = ms

    # -- what happened ------------------------------------------------------------------
    def finished(self, offset: int, attempt: int | None = None) -> None:
        """Acked or dead-lettered: done for good. The late ack of an ``attempt`` that a
        redelivery overtook, while the redelivery still runs: an ordered partition
        starts nothing beside that run until it ends (``run_ended``) or its visibility
        timeout passes (guarantee I5)."""
        self._writing()
        entry = self.entries.get(offset)
        if entry is None:
            return
        if entry.in_flight and attempt is not None and attempt < entry.attempt:
            self.overtaken(offset, entry.attempt,
                           max(entry.visible_again_ms, entry.held_until_ms))
        entry.done, entry.in_flight, entry.row = True, False, None
        self.open_entries.pop(offset, None)

    def overtaken(self, offset: int, attempt: int, until_ms: int) -> None:
        """The run of ``attempt`` goes on although its message is done already."""
        self._writing()
        self.overtaken_runs[offset] = (attempt, until_ms)

    def run_ended(self, offset: int, attempt: int) -> None:
        """The run of ``attempt`` answered (its outcome is recorded)."""
        self._writing()
        if self.overtaken_runs.get(offset, (0, 0))[0] == attempt:
            del self.overtaken_runs[offset]

    def retry_at(self, offset: int, due_ms: int) -> None:
        self._writing()
        entry = self.entries.get(offset)
        if entry is not None:
            entry.in_flight, entry.due_ms = False, due_ms

    def given_back(self, offset: int) -> None:
        self._writing()
        entry = self.entries.get(offset)
        if entry is not None:
            entry.in_flight, entry.retry_count = False, entry.previous_retry_count

    # -- the watermark ------------------------------------------------------------------
    def advance_candidate(self, horizon_ms: int | None) -> int:
        """The highest offset the watermark may move to: the end of the run of done
        entries just above it whose rows are settled (created before ``horizon_ms``;
        None means every visible row is settled)."""
        candidate = self.watermark
        for offset in sorted(self.entries):
            entry = self.entries[offset]
            if not entry.done or (horizon_ms is not None and entry.created_at >= horizon_ms):
                return candidate
            candidate = offset
        # Everything fetched is done. Once no transaction that was open when the fetch
        # read up to ``covered`` can still commit, nothing can appear below it: the
        # watermark may close the window (offsets there belong to other partitions).
        if horizon_ms is None or horizon_ms > self.covered_at_ms:
            candidate = max(candidate, self.covered)
        return candidate

    def done_above_watermark(self) -> bool:
        """The first row fetched above the watermark is done: the watermark can move."""
        first = min(self.entries, default=None)
        return first is not None and self.entries[first].done

    @property
    def window_open(self) -> bool:
        return self.covered > self.watermark or bool(self.entries)

    def first_open(self) -> int | None:
        """The first fetched offset not done yet: with every fetched row between the
        watermark and it done, the group's first pending message (None: none fetched)."""
        return min(self.open_entries, default=None)

    def moved_watermark(self, new_watermark: int) -> None:
        self._writing()
        for offset in [o for o in self.entries if o <= new_watermark]:
            del self.entries[offset]
            self.open_entries.pop(offset, None)
        self.watermark = max(self.watermark, new_watermark)

    # -- status ---------------------------------------------------------------------------
    def busy(self, now_ms: int) -> bool:
        """Work that ``--until-empty`` waits for: in flight, deliverable, or retrying.
        A message scheduled for later and never delivered does not count."""
        for entry in self.open_entries.values():
            if entry.in_flight or entry.due_ms <= now_ms or entry.retry_count is not None:
                return True
        return False
