"""Named statements of publishing: storing messages, finding the offsets of stored ones,
and the idempotency window's keys; PostgreSQL's own (its INSERT returning offsets, COPY
with reserved offsets, wake-ups by ``NOTIFY``) in ``PostgreSQLPublishing``. Each returns
a ``Statement``; ``sqlqueue.storage.sql`` runs them on a Django connection (MySQL's
with the values escaped inline by the live connection), and the Spark writer reads
``select_message_offsets`` to check what a bulk load stored."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from sqlqueue.storage.statements.tables import IDEMPOTENCY_TABLE, MESSAGE_KEY, MESSAGE_TABLE
from sqlqueue.storage.statements.vendors import Statement, Vendor

MessageKey = tuple[str, str]  # (partition_key, id) within one topic
#: (key_high, key_low): the 128-bit digest of (topic, partition_key, id), see
#: sqlqueue.publishing.messages.idempotency_digest
IdempotencyDigest = tuple[int, int]
#: the columns a published row sets (``created_at``: the database clock)
INSERT_COLUMNS = (
    "topic", "partition_key", "id", "payload", "metadata", "created_at",
    "published_at", "priority", "deliver_after",
)
#: the columns a published row gives values for where ``created_at`` is left to the
#: database (its column DEFAULT on MySQL, the clock expression elsewhere)
VALUE_COLUMNS = tuple(c for c in INSERT_COLUMNS if c != "created_at")
#: The NOTIFY channel of wake-ups (sqlqueue.wakeups); its payload is the topic. NOTIFY
#: stays within one database, so the channel needs no database name.
WAKEUP_CHANNEL = "sqlqueue_wakeups"
#: the payload of a runner's heartbeat on that channel: never a topic (a topic is not
#: empty), so it rings nothing; hearing it proves a listening session still hears
HEARTBEAT_PAYLOAD = ""
#: the values of a message stored alone without a delay (``one_message_params``)
ONE_MESSAGE_VALUES = 8


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
    #: the id is a fresh UUIDv7 made by sqlqueue, so it cannot already be stored
    fresh_id: bool = False

    @property
    def key(self) -> MessageKey:
        return (self.partition_key, self.id)


def one_message_params(row: MessageRow) -> list[Any]:
    """The parameters of ``store_messages`` of one row without a delay: its eight values
    (``ONE_MESSAGE_VALUES``)."""
    return [row.topic, row.partition_key, row.id, row.payload, row.metadata,
            row.published_at, row.priority, row.deliver_at_ms]


def message_params(rows: Sequence[MessageRow]) -> list[Any]:
    """Nine parameters a row: the values of ``store_messages``."""
    params: list[Any] = []
    for r in rows:
        params += [r.topic, r.partition_key, r.id, r.payload, r.metadata,
                   r.published_at, r.priority, r.delay_ms, r.deliver_at_ms]
    return params


class PublishingStatements(Vendor):
    """Publishing, for any vendor (a mixin of ``Statements``)."""

    def store_messages(self, rows: Sequence[MessageRow]) -> Statement:
        """``insert_messages``: a multi-row INSERT (at least one row); a duplicate key
        fails the statement."""
        now = self.now_ms_sql
        one_row = f"(%s, %s, %s, %s, %s, {now}, %s, %s, COALESCE({now} + %s, %s))"
        return (f"INSERT INTO {self.quote(MESSAGE_TABLE)} ({self.names(INSERT_COLUMNS)}) "
                f"VALUES {', '.join([one_row] * len(rows))}", message_params(rows))

    def select_message_offsets(self, topic: str, keys: Iterable[MessageKey], *,
                               lock: bool = False) -> Statement:
        """``select_message_offsets``: (offset, partition_key, id) of the stored ones of
        (partition_key, id) pairs of one topic (at least one). An OR of full-key
        equalities, which every vendor turns into point lookups on
        ``idx_topic_partition_id`` (SQLite needs the topic in every term)."""
        q = self.quote
        text = self.text_mark
        term = f"({q('topic')} = {text} AND {q('partition_key')} = {text} AND {q('id')} = {text})"
        params: list[Any] = []
        for partition_key, message_id in keys:
            params += [topic, partition_key, message_id]
        return (
            f"SELECT {q('offset')}, {q('partition_key')}, {q('id')} FROM {q(MESSAGE_TABLE)} "
            f"WHERE {' OR '.join([term] * (len(params) // 3))}"
            + (self.locking_read_suffix if lock else ""),
            params,
        )

    # the idempotency window (docs/reference/api.md) ------------------------------------
    def select_idempotency_keys(self, highs: Sequence[int], *, lock: bool) -> Statement:
        """``select_idempotency_keys``: (key_high, key_low, offset) of the keys still in
        their window whose first column is one of ``highs`` (at least one): the primary
        key sought by its first column (64 bits of a digest: practically unique; the
        caller checks the rest). ``lock``: a locking read, which sees keys committed
        after this transaction's snapshot."""
        q = self.quote
        return (
            f"SELECT {q('key_high')}, {q('key_low')}, {q('message_offset')} "
            f"FROM {q(IDEMPOTENCY_TABLE)} WHERE {q('key_high')} IN ({self.marks(len(highs))}) "
            f"AND {q('expires_at')} > {self.now_ms_sql}"
            + (self.locking_read_suffix if lock else ""),
            list(highs),
        )

    def remember_idempotency_keys(self, keys: Sequence[tuple[int, int, int]],
                                  window_ms: int) -> Statement:
        """``remember_idempotency_keys``: store (key_high, key_low, offset) of messages
        just published (at least one), until the database clock's now + ``window_ms``.
        A key still present but expired (not yet collected) is replaced."""
        columns = ("key_high", "key_low", "message_offset", "expires_at")
        one_row = f"(%s, %s, %s, {self.now_ms_sql} + %s)"
        upsert = self.upsert_clause(("key_high", "key_low"), {
            "message_offset": "{new}(message_offset)", "expires_at": "{new}(expires_at)"},
            table=IDEMPOTENCY_TABLE)
        return (
            f"INSERT INTO {self.quote(IDEMPOTENCY_TABLE)} ({self.names(columns)}) "
            f"VALUES {', '.join([one_row] * len(keys))} {upsert}",
            [value for high, low, offset in keys for value in (high, low, offset, window_ms)],
        )


class MySQLPublishing(PublishingStatements):
    """MySQL's and MariaDB's INSERT (a mixin of ``MySQLStatements``)."""

    def store_messages(self, rows: Sequence[MessageRow]) -> Statement:
        """``insert_messages`` on the hot path of publishing: ``created_at`` is left to
        the column's DEFAULT (the database clock, migration 0006), since an expression
        repeated in every row costs the server more to parse than the row costs to
        store; a row's ``deliver_after`` is the clock plus its delay only where it has
        one. The executor inlines the values (``execute_rows``)."""
        head, at_once, delayed = self._insert_parts
        params: list[Any] = []
        values: list[str] = []
        for r in rows:
            values.append(at_once if r.delay_ms is None else delayed)
            params += [r.topic, r.partition_key, r.id, r.payload, r.metadata,
                       r.published_at, r.priority,
                       r.deliver_at_ms if r.delay_ms is None else r.delay_ms]
        return head + ",".join(values), params

    @functools.cached_property
    def _insert_parts(self) -> tuple[str, str, str]:
        """``store_messages``' head and its two shapes of a row (at once, delayed): the
        same for every statement, so built once (building them for each message was a
        fifth of a one-message publish's Python)."""
        return (f"INSERT INTO {self.quote(MESSAGE_TABLE)} ({self.names(VALUE_COLUMNS)}) VALUES ",
                _MYSQL_ROW % "%s", _MYSQL_ROW % f"{self.now_ms_sql} + %s")


#: a MySQL row of ``store_messages``: the payload is bytes (``_binary``), and the
#: ``deliver_after`` expression is filled in per row (``%%s`` stays a placeholder)
_MYSQL_ROW = "(%%s,%%s,%%s,_binary%%s,%%s,%%s,%%s,%s)"


class PostgreSQLPublishing(Vendor):
    """PostgreSQL's own publishing statements (a mixin of ``PostgreSQLStatements``)."""

    def store_messages(self, rows: Sequence[MessageRow], *, skip_stored: bool = False,
                       wake: bool = False) -> Statement:
        """``insert_messages`` for PostgreSQL: a multi-row INSERT returning the offset
        and key of each row it stored (one row: its offset alone). A row whose (topic,
        partition_key, id) is stored fails the statement, or with ``skip_stored``
        (``insert_new_messages``) is skipped (``ON CONFLICT DO NOTHING`` on
        ``idx_topic_partition_id``). The clock is read
        once for the statement (``created_at``, and ``deliver_after`` of a delay, from
        the same reading) and after the transaction has its id (``write_horizon``).

        ``wake``: ``notify_wakeup`` the topic of each row stored, in the same statement
        (a skipped row notifies nothing); one round trip fewer for a message published
        alone. One row without a delay reads the clock in its VALUES (used once): the
        cheapest shape for the server, 0.04 ms a message less than selecting from a
        clock subquery, which the other rows need to use one reading twice."""
        if len(rows) == 1 and rows[0].delay_ms is None:
            return self._one_message_texts[skip_stored, wake], one_message_params(rows[0])
        names = ("topic", "partition_key", "id", "payload", "metadata", "published_at",
                 "priority", "delay", "deliver_at")
        if len(rows) == 1:
            v = dict.fromkeys(names, "%s")
            source = ""
        else:
            v = {name: f"v.{name}" for name in names}
            values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(rows))
            source = f"(VALUES {values}) v({', '.join(names)}) CROSS JOIN "
        select = ", ".join([
            v["topic"], v["partition_key"], v["id"], f"{v['payload']}::bytea",
            f"{v['metadata']}::jsonb", "c.now_ms", f"{v['published_at']}::bigint",
            f"{v['priority']}::smallint",
            f"COALESCE(c.now_ms + {v['delay']}::bigint, {v['deliver_at']}::bigint)",
        ])
        return (
            f"INSERT INTO {self.quote(MESSAGE_TABLE)} ({self.names(INSERT_COLUMNS)}) "
            f"SELECT {select} FROM {source}(SELECT {self.message_clock_sql} AS now_ms) c "
            f"{self._returning(skip_stored=skip_stored, wake=wake, keys=len(rows) > 1)}",
            message_params(rows),
        )

    def _returning(self, *, skip_stored: bool, wake: bool, keys: bool = True) -> str:
        """The tail of ``store_messages``: skip stored rows or not, RETURNING the offset
        of each row stored, with ``keys`` its key too (the offsets of many rows come
        back in no promised order), and with ``wake`` the ``pg_notify`` of its topic (a
        constant channel, the topic read from the row: no parameter to send)."""
        q = self.quote
        skip = f"{self.insert_if_absent_suffix(MESSAGE_KEY)} " if skip_stored else ""
        key = f", {q('partition_key')}, {q('id')}" if keys else ""
        notify = f", pg_notify('{WAKEUP_CHANNEL}', {q('topic')})" if wake else ""
        return f"{skip}RETURNING {q('offset')}{key}{notify}"

    @functools.cached_property
    def _one_message_texts(self) -> dict[tuple[bool, bool], str]:
        """``store_messages`` of one row without a delay, by (skip_stored, wake): the
        same text for every message, so built once (building it for each message was a
        fifth of a one-message publish's Python)."""
        marks = ["%s"] * ONE_MESSAGE_VALUES
        return {(skip, wake): self._one_message_insert(marks, skip_stored=skip, wake=wake)
                for skip in (False, True) for wake in (False, True)}

    def _one_message_insert(self, marks: Sequence[str], *, skip_stored: bool,
                            wake: bool) -> str:
        """``store_messages`` of one row without a delay, its parameters written as
        ``marks`` (``%s``, or ``$1``... in ``prepare_stored_message``). It returns the
        offset alone: one row needs no key to say whose it is."""
        m = marks
        return (
            f"INSERT INTO {self.quote(MESSAGE_TABLE)} ({self.names(INSERT_COLUMNS)}) "
            f"VALUES ({m[0]}, {m[1]}, {m[2]}, {m[3]}::bytea, {m[4]}::jsonb, "
            f"{self.message_clock_sql}, {m[5]}::bigint, {m[6]}::smallint, {m[7]}::bigint) "
            f"{self._returning(skip_stored=skip_stored, wake=wake, keys=False)}"
        )

    # -- the one-message INSERT prepared in a session ------------------------------------
    def prepare_stored_message(self, name: str, *, skip_stored: bool, wake: bool) -> Statement:
        """``prepare_stored_message``: ``store_messages`` of one row without a delay,
        prepared in the session as ``name``: parsed and planned once, after which a
        publish sends only ``execute_stored_message``. Its parameters are the row's
        eight values (``one_message_params``)."""
        marks = [f"${n}" for n in range(1, ONE_MESSAGE_VALUES + 1)]
        insert = self._one_message_insert(marks, skip_stored=skip_stored, wake=wake)
        return f"PREPARE {self.quote(name)} AS {insert}", []

    def execute_stored_message(self, name: str, row: MessageRow) -> Statement:
        """``execute_stored_message``: run ``prepare_stored_message``'s ``name`` for
        ``row``."""
        return self._execute_text(name), one_message_params(row)

    @functools.cache  # noqa: B019 - a vendor's statements live as long as the process
    def _execute_text(self, name: str) -> str:
        marks = ", ".join(["%s"] * ONE_MESSAGE_VALUES)
        return f"EXECUTE {self.quote(name)}({marks})"

    def server_session_pid(self) -> Statement:
        """``server_session_pid``: the process id of the server session this connection
        reaches. A connection pooler between the two tells the client a key of its own
        at connect time, not this (``sqlqueue.storage.sql.prepared``)."""
        return "SELECT pg_backend_pid()", []

    def select_message_offsets(self, topic: str, keys: Iterable[MessageKey], *,
                               lock: bool = False) -> Statement:
        """``select_message_offsets`` for PostgreSQL: the keys travel as two arrays, and
        each is one lookup on ``idx_topic_partition_id``. The OR of key equalities the
        other vendors run took PostgreSQL 120-420 ms to plan for a batch of 1,000 keys (a
        bitmap scan per term), ten times the batch's COPY. The lookup is a LATERAL
        subquery with a LIMIT (the key is unique): PostgreSQL never flattens it into a
        join, which it may run as a hash of the whole topic (0.55 s for 1,000 keys on a
        table never analyzed). On such a table it may still seek by
        ``idx_topic_partition_offset`` and filter by id, as the OR did: the operations
        guide asks for autovacuum."""
        q = self.quote
        partition_keys, ids = [], []
        for partition_key, message_id in keys:
            partition_keys.append(partition_key)
            ids.append(message_id)
        return (
            f"SELECT m.{q('offset')}, m.{q('partition_key')}, m.{q('id')} "
            f"FROM unnest(%s::text[], %s::text[]) AS k(partition_key, id) "
            f"CROSS JOIN LATERAL (SELECT {q('offset')}, {q('partition_key')}, {q('id')} "
            f"FROM {q(MESSAGE_TABLE)} WHERE {q('topic')} = %s "
            f"AND {q('partition_key')} = k.partition_key AND {q('id')} = k.id LIMIT 1"
            + (self.locking_read_suffix if lock else "") + ") m",
            [partition_keys, ids, topic],
        )

    def delete_inserted_messages(self, offsets: Sequence[int]) -> Statement:
        """``delete_inserted_messages``: take back the rows an ``insert_new_messages`` of
        this transaction stored when another of its rows was a duplicate (primary key)."""
        q = self.quote
        return f"DELETE FROM {q(MESSAGE_TABLE)} WHERE {q('offset')} = ANY(%s)", [list(offsets)]

    def reserve_offsets(self, count: int) -> Statement:
        """``reserve_offsets``: the clock a ``copy_messages`` stamps ``created_at`` with,
        read after the transaction has its id (``message_clock_sql``, as the INSERT's
        clock is: the exact ``write_horizon`` rests on it), and the next ``count``
        offsets of queue_messages' identity sequence."""
        return (f"SELECT {self.message_clock_sql}, ARRAY(SELECT nextval("
                f"pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s))",
                [MESSAGE_TABLE, "offset", count])

    def copy_messages(self) -> Statement:
        """``copy_messages``: COPY FROM STDIN (text format) into queue_messages, offsets
        and clock included (the executor streams the rows). A duplicate (topic,
        partition_key, id) fails it whole."""
        return (f"COPY {self.quote(MESSAGE_TABLE)} ({self.names(('offset', *INSERT_COLUMNS))}) "
                f"FROM STDIN", [])

    def notify_wakeup(self, topic: str) -> Statement:
        """``notify_wakeup``: queued by the server and delivered to the listeners only
        when the transaction commits (never if it rolls back); identical notifications
        of one transaction are delivered once."""
        return "SELECT pg_notify(%s, %s)", [WAKEUP_CHANNEL, topic]

    def notify_heartbeat(self) -> Statement:
        """``notify_heartbeat``: a notification every listener hears (at once, in
        autocommit) that wakes no topic: what a runner sends when its own listener has
        heard nothing for a while, to tell a quiet channel from a deaf session."""
        return "SELECT pg_notify(%s, %s)", [WAKEUP_CHANNEL, HEARTBEAT_PAYLOAD]

    def listen_wakeups(self) -> Statement:
        """``listen_wakeups``: subscribe a session to the wake-up channel (the listener's
        own connection, in autocommit)."""
        return f"LISTEN {self.quote(WAKEUP_CHANNEL)}", []
