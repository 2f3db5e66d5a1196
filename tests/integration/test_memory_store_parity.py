"""The in-memory store of the engine's unit tests (tests/engine) against the real
statements: one script run on this database and on ``MemoryStore``, their answers
compared, that reaches every method of every engine protocol
(``sqlqueue.storage.protocols.ENGINE_PROTOCOLS``): a method the script does not call
fails the test, and so does one the memory store lacks. Offsets differ between the two
(sequences), so they are compared by the message ids they name; times by what they
decide. What is the vendor's own (``VENDOR_OWN``) is compared by what the engine relies
on, not by value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import IntegrityError, connection, connections

from sqlqueue import storage
from sqlqueue.horizon import WriteHorizon
from sqlqueue.storage.protocols import ENGINE_PROTOCOLS
from sqlqueue.storage.sql import MessageRow
from sqlqueue.storage.statements.dead_letters import DeadLetterWrite
from sqlqueue.storage.statements.delivery import OutcomeWrite
from tests.engine.harness import ALIASES, memory_queue
from tests.engine.memory.conformance import protocol_members

pytestmark = pytest.mark.django_db

G, T, LONG, HOUR = "g", "t", 60_000, 3_600_000

#: members whose answer is the vendor's own (its limits, its server, its sessions): the
#: script checks what the engine relies on of them, and the reason says why no more
VENDOR_OWN = {
    "narrows_fetches": "PostgreSQL asks partitions_with_rows first (planning cost)",
    "notifies_wakeups": "PostgreSQL notifies at commit; the harness steps the runners",
    "max_query_params": "the driver's parameter limit",
    "max_rows_per_insert": "rows per INSERT: each vendor's measured best",
    "max_statement_bytes": "MySQL's max_allowed_packet",
    "max_row_bytes": "MySQL's max_allowed_packet, known after check_connection",
    "literal_bytes": "MySQL inlines escaped values; the others send parameters",
    "publishing_cursor": "MySQL's InsertCursor; the others Django's",
    "server_identity": "which server answered ('' on SQLite and in memory)",
    "head_and_server": "the head is compared; the server is the vendor's",
    "bound_idle_transactions": "MySQL and PostgreSQL end idle sessions; SQLite and memory cannot",
    "bound_transaction_lock_waits": "PostgreSQL's SET LOCAL; None elsewhere",
    "write_horizon": "MySQL and PostgreSQL read open transactions; SQLite and memory have "
                     "one writer, nothing commits out of offset order (None)",
    "offset_counter": "the sequence's own position (compared: not below the head)",
}


class Recorded:
    """A store whose members the script reached are written down (``seen``)."""

    def __init__(self, store: Any, seen: set[str]) -> None:
        self._store, self._seen = store, seen

    def __getattr__(self, name: str) -> Any:
        self._seen.add(name)
        return getattr(self._store, name)


class Side:
    """One database's run of the script: its store, and the offsets its messages got."""

    def __init__(self, store: Any, cursor: Any) -> None:
        self.seen: set[str] = set()
        self.d, self.c = Recorded(store, self.seen), cursor
        self.offsets: dict[str, int] = {}

    def o(self, message_id: str) -> int:
        return self.offsets[message_id]

    def name(self, offset: int) -> str:
        return {o: i for i, o in self.offsets.items()}.get(offset, f"?{offset}")

    def insert(self, *keys: tuple[str, str]) -> object:
        rows = [MessageRow(T, pk, mid, b'"x"', None, 1, 50, None, 0) for pk, mid in keys]
        try:
            offsets = self.d.insert_messages(self.c, rows)
        except IntegrityError as error:
            return ("duplicate", self.d.is_duplicate_message(error))
        found = self.d.select_message_offsets(self.c, T, [(pk, mid) for pk, mid in keys],
                                              lock=False)
        self.offsets.update({mid: found[(pk, mid)] for pk, mid in keys})
        return offsets is None or len(offsets)

    def rows(self, partition: str, topic: str = T, group: str = G) -> list[tuple[Any, ...]]:
        return [(r.id, r.acked, _clock_free(r.invisible_until), r.retry_count,
                 r.consumer_group)
                for r in self.d.fetch_messages(self.c, group, topic, partition, 0, 100)]

    def leases(self) -> list[tuple[str, str, int, bool]]:
        return sorted((p, owner, generation, age < LONG)
                      for p, owner, generation, age in self.d.list_leases(self.c, G, T))

    now = 0  # the database clock at the step (the memory store's is set to it)

    def minute(self, ago_ms: int) -> int:
        """The start of the minute ``ago_ms`` from now (negative: in the past)."""
        at = self.now + ago_ms
        return at - at % 60_000

    def minute_rows(self, since: int) -> list[tuple[Any, ...]]:
        return [(g, t, self.now - minute < 3 * HOUR, *(float(v) for v in values))
                for g, t, minute, *values in self.d.read_minute_stats(
                    self.c, since, ("ack", "retry", "duration_sum"))]

    def watermarks(self) -> dict[str, dict[str, str]]:
        groups, by_partition = self.d.topic_watermarks(self.c, T)
        return {p: {g: self.name(w) if w else "0" for g, w in marks.items()}
                for p, marks in by_partition.items()} | {"groups": dict.fromkeys(groups, "")}


def _clock_free(ms: int | None) -> int | str | None:
    """A time the database stamped from its clock (now + something) says only that."""
    return "from now" if ms is not None and ms > 10**12 else ms


def ow(side: Side, mid: str, acked: bool, invisible_until: int = 0, error: str = "",
       partition: str = "p0") -> OutcomeWrite:
    return OutcomeWrite(partition, side.o(mid), acked, invisible_until, error)


SCRIPT: list[tuple[str, Callable[[Side], object]]] = [
    ("insert", lambda s: s.insert(("p0", "a"), ("p0", "b"), ("p1", "c"))),
    ("insert a duplicate", lambda s: s.insert(("p0", "a"))),
    ("discover_partitions", lambda s: sorted(s.d.discover_partitions(s.c, T))),
    ("head_and_server", lambda s: (s.name(s.d.head_and_server(s.c)[0]),
                                   isinstance(s.d.head_and_server(s.c)[1], str),
                                   isinstance(s.d.server_identity(s.c), str))),
    ("fetch_partitions", lambda s: {p: [r.id for r in rows] for p, rows in s.d.fetch_partitions(
        s.c, G, T, [("p0", 0), ("p1", 0), ("p2", 0)], 10).items()}),
    ("fetch_partitions after, limited", lambda s: {
        p: [r.id for r in rows] for p, rows in s.d.fetch_partitions(
            s.c, G, T, [("p0", s.o("a")), ("p1", 0)], 1).items()}),
    ("fetch, never delivered", lambda s: s.rows("p0")),
    ("mark_delivered", lambda s: s.d.mark_delivered(
        s.c, G, T, [("p0", s.o("a"), 5_000), ("p0", s.o("b"), 6_000), ("p1", s.o("c"), 1)])),
    ("mark_delivered again", lambda s: s.d.mark_delivered(s.c, G, T, [("p0", s.o("a"), 7_000)])),
    ("fetch, delivered", lambda s: s.rows("p0")),
    ("write_outcomes", lambda s: s.d.write_outcomes(s.c, G, T, [
        ow(s, "a", True), ow(s, "b", False, 9_000, "boom")])),
    ("fetch, acked and retrying", lambda s: s.rows("p0")),
    ("mark_delivered an acked row", lambda s: s.d.mark_delivered(
        s.c, G, T, [("p0", s.o("a"), 11_000), ("p0", s.o("b"), 10_000)])),
    ("an acked row stays acked", lambda s: s.d.write_outcomes(s.c, G, T, [
        ow(s, "a", False, 12_000, "late")])),
    ("fetch, acked untouched", lambda s: s.rows("p0")),
    ("give_back to a retry count", lambda s: s.d.give_back(s.c, G, T, [("p0", s.o("b"))], 0)),
    ("give_back a first delivery", lambda s: s.d.give_back(s.c, G, T, [("p1", s.o("c"))], None)),
    ("fetch, given back", lambda s: (s.rows("p0"), s.rows("p1"))),
    ("extend_visibility", lambda s: (
        s.d.extend_visibility(s.c, G, T, "p0", s.o("a"), 1_000),
        s.d.extend_visibility(s.c, G, T, "p0", s.o("b"), 1_000),
        s.d.extend_visibility(s.c, G, T, "p1", s.o("c"), 1_000))),
    ("restamp_visibility", lambda s: (s.d.restamp_visibility(s.c, G, T, [
        ("p0", s.o("a")), ("p0", s.o("b")), ("p1", s.o("c"))], 2_000), s.rows("p0"),
        s.rows("p1"))),
    ("acked_among", lambda s: sorted((p, s.name(o)) for p, o in s.d.acked_among(
        s.c, G, T, [("p0", s.o("a")), ("p0", s.o("b")), ("p1", s.o("c"))], lock=True))),
    ("ack_deliveries", lambda s: (
        s.d.ack_deliveries(s.c, G, T, [("p0", s.o("b"), 1)]),  # delivered again since
        s.d.ack_deliveries(s.c, G, T, [("p0", s.o("a"), 1)]),  # acked already
        s.d.ack_deliveries(s.c, G, T, [("p0", s.o("b"), 0), ("p1", s.o("c"), 0)]),
        s.rows("p0"))),
    ("runs_in_flight", lambda s: {p: _clock_free(until) for p, until in s.d.runs_in_flight(
        s.c, G, T, [("p0", 0), ("p1", 0)]).items()}),
    ("list_offsets", lambda s: {p: [s.name(o) for o in offsets] for p, offsets in
                                s.d.list_offsets(s.c, T, [("p0", 0, s.o("b"))], 10).items()}),
    ("list_offsets of two windows", lambda s: {
        p: [s.name(o) for o in offsets] for p, offsets in s.d.list_offsets(
            s.c, T, [("p0", s.o("a"), s.o("c")), ("p1", 0, s.o("c")),
                     ("p2", 0, s.o("c"))], 10).items()}),
    ("list_offsets, a limit a window", lambda s: {
        p: [s.name(o) for o in offsets] for p, offsets in s.d.list_offsets(
            s.c, T, [("p0", 0, s.o("c")), ("p1", 0, s.o("c"))], 1).items()}),
    ("fetch_messages_at", lambda s: [r.id for r in s.d.fetch_messages_at(
        s.c, G, T, "p0", [s.o("b"), s.o("c")])]),
    ("partitions_with_rows", lambda s: sorted(s.d.partitions_with_rows(
        s.c, T, s.o("a"), s.o("c")))),
    ("ensure_watermark", lambda s: s.d.ensure_watermark(s.c, G, T, "p0")),
    ("advance_watermarks", lambda s: (
        s.d.advance_watermarks(s.c, G, T, [("p0", s.o("a"), None)]),
        s.d.advance_watermarks(s.c, G, T, [("p0", s.o("a"), None)]),
        s.d.ensure_watermark(s.c, G, T, "p0") == s.o("a"))),
    ("advance_watermarks of two, one of them back", lambda s: (
        s.d.ensure_watermark(s.c, G, T, "p1"),
        s.d.advance_watermarks(s.c, G, T, [("p0", s.o("a") - 1, None),
                                          ("p1", s.o("c"), s.o("c") + 1)]),
        s.watermarks())),
    ("topic_watermarks", lambda s: s.watermarks()),
    ("delete_states_upto", lambda s: s.d.delete_states_upto(s.c, G, T, [("p0", s.o("a"))])),
    ("fetch, state gone", lambda s: s.rows("p0")),
    ("start_at_heads", lambda s: (s.d.start_at_heads(s.c, "g2", T),
                                  s.d.start_at_heads(s.c, "g2", T), s.watermarks())),
    ("insert_dead_letters", lambda s: s.d.insert_dead_letters(
        s.c, dead_letter_topic="t_dlq", group=G, letters=[
            DeadLetterWrite(s.o("b"), "b@g", 3, "boom", '{"id": "b"}')])),
    ("insert_dead_letters again", lambda s: s.d.insert_dead_letters(
        s.c, dead_letter_topic="t_dlq", group=G, letters=[
            DeadLetterWrite(s.o("b"), "b@g", 4, "boom", '{"id": "b"}')])),
    ("the dead letter", lambda s: [(r.id, r.consumer_group, r.deliver_after) for r in
                                   s.d.fetch_messages(s.c, G, "t_dlq", "p0", 0, 10)]),
    ("acquire_leases", lambda s: (
        s.d.acquire_leases(s.c, G, T, ["p0", "p1"], "r1", LONG), s.leases())),
    ("a live lease stays", lambda s: (
        s.d.acquire_leases(s.c, G, T, ["p0"], "r2", LONG), s.leases())),
    ("an expired lease changes hands", lambda s: (
        s.d.acquire_leases(s.c, G, T, ["p0"], "r2", -1_000), s.leases())),
    ("renew_leases", lambda s: (
        s.d.renew_leases(s.c, G, T, "r1", {"p0": 1, "p1": 1}),
        s.d.renew_leases(s.c, G, T, "r2", {"p0": 2}), s.d.renew_leases(s.c, G, T, "r2", {"p0": 1}),
        s.d.renew_leases(s.c, G, T, "r1", {}))),
    ("fence_leases", lambda s: [(p, o, g) for p, o, g, _ in s.d.fence_leases(
        s.c, G, T, ["p0"])[0]]),
    ("release_leases", lambda s: (
        s.d.release_leases(s.c, G, T, ["p0"], "r1"), s.d.release_leases(s.c, G, T, ["p0"], "r2"),
        s.leases())),
    ("heartbeats", lambda s: (
        s.d.heartbeat(s.c, G, T, "r1"), s.d.heartbeat(s.c, G, T, "r2"),
        s.d.live_subscribers(s.c, G, T, LONG), s.d.deregister(s.c, G, T, "r1"),
        s.d.live_subscribers(s.c, G, T, LONG))),
    ("purge_abandoned", lambda s: (
        s.d.purge_abandoned(s.c, G, T, -1_000), s.d.live_subscribers(s.c, G, T, LONG),
        s.leases())),
    ("idempotency keys", lambda s: (
        s.d.remember_idempotency_keys(s.c, [(1, 2, s.o("a"))], LONG),
        {k: s.name(o) for k, o in s.d.select_idempotency_keys(
            s.c, [(1, 2), (3, 4)], lock=False).items()},
        s.d.delete_expired_idempotency_keys(s.c, 10))),
    ("delete_messages_upto", lambda s: (
        s.d.delete_messages_upto(s.c, T, "p0", s.o("a"), 10),
        [r.id for r in s.d.fetch_messages(s.c, G, T, "p0", 0, 10)])),
    ("insert more", lambda s: s.insert(("p0", "d"), ("p1", "e"), ("p0", "f"), ("p2", "g"))),
    ("first_offsets_above", lambda s: [None if o is None else s.name(o) for o in
                                       s.d.first_offsets_above(s.c, T, [
                                           ("p0", 0), ("p0", s.o("d")), ("p1", s.o("e")),
                                           ("p9", 0)])]),
    ("delete_messages_in_window", lambda s: (
        s.d.delete_messages_in_window(s.c, T, s.o("b"), s.o("f"),
                                      [("p0", s.o("d")), ("p1", s.o("f"))]),
        s.d.delete_messages_in_window(s.c, T, 0, s.o("g"), []),
        {p: [r.id for r in s.d.fetch_messages(s.c, G, T, p, 0, 10)]
         for p in ("p0", "p1", "p2")})),
    ("the server record", lambda s: (
        s.d.record_server(s.c, "s1"), s.d.record_server(s.c, "s1"),
        s.d.record_server(s.c, "s2", ["s0"]), s.d.record_server(s.c, "s2", ["s1"]))),
    ("void_grants", lambda s: (
        s.d.acquire_leases(s.c, G, T, ["p0", "p1"], "r1", LONG), s.d.heartbeat(s.c, G, T, "r1"),
        s.d.mark_delivered(s.c, G, T, [("p0", s.o("f"), 10**13)]),
        s.d.void_grants(s.c), s.leases(), s.d.live_subscribers(s.c, G, T, LONG),
        s.rows("p0"))),
    ("pauses and runner requests, none", lambda s: (
        s.d.list_pauses(s.c), s.d.runner_request(s.c, "r1"),
        s.d.obey_runner_request(s.c, "r1", 0))),
    ("minute stats", lambda s: (
        s.d.add_minute_stats(s.c, {
            (G, T, s.minute(0)): {"ack": 2, "duration_sum": 0.5},
            (G, T, s.minute(-2 * HOUR)): {"ack": 1}}),
        s.d.add_minute_stats(s.c, {(G, T, s.minute(0)): {"ack": 1, "retry": 1}}),
        s.minute_rows(s.minute(-3 * HOUR)),
        s.d.delete_minute_stats(s.c, HOUR), s.minute_rows(0))),
    # bound_lock_waits: 50 s, the server's default (MySQL's test session keeps it)
    ("what a session sets", lambda s: (
        s.d.bound_lock_waits(s.c, 50), isinstance(s.d.bound_idle_transactions(s.c, 600_000), bool),
        s.d.bound_transaction_lock_waits(5) is None or
        isinstance(s.d.bound_transaction_lock_waits(5), tuple),
        s.d.through_pooler(s.c), s.d.is_lock_wait(ValueError("not a lock wait")),
        s.d.notify_heartbeat(s.c), s.d.notify_wakeup(s.c, T),
        s.d.narrows_fetches in (True, False), s.d.notifies_wakeups in (True, False))),
    ("the clocks", lambda s: (
        abs(s.d.database_now_ms(s.c) - s.now) < 1_000,
        isinstance(s.d.write_horizon(s.c), WriteHorizon | None),
        s.d.offset_counter(s.c) is None or s.d.offset_counter(s.c) >= s.o("g"))),
    ("what publishing sizes", lambda s: (
        s.d.check_connection(), s.d.max_rows_per_insert >= 100,
        s.d.max_query_params() >= 999, s.d.max_statement_bytes() >= 1 << 20,
        s.d.max_row_bytes() is None or s.d.max_row_bytes() > 1 << 10,
        s.d.literal_bytes(b"x" * 10, "{}") >= 12,
        hasattr(s.d.publishing_cursor(), "execute"))),
]


def test_the_memory_store_answers_as_the_database_does() -> None:
    with memory_queue() as queue:
        memory = connections[ALIASES[0]]
        with connection.cursor() as cursor, memory.cursor() as memory_cursor:
            real = Side(storage.store(connection), cursor)
            fake = Side(storage.store(memory), memory_cursor)
            for name, step in SCRIPT:
                queue.clock.ms = real.now = fake.now = real.d.database_now_ms(cursor)
                assert step(fake) == step(real), name
    members = protocol_members(ENGINE_PROTOCOLS)
    assert members - fake.seen == set(), "engine protocol methods the script never runs"
    assert fake.seen == real.seen
    assert set(VENDOR_OWN) <= members, "VENDOR_OWN names a method of no engine protocol"
