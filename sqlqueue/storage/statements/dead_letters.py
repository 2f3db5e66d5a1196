"""Named statements of dead letters: copying failed messages into their dead-letter
topic (many in one statement), replaying dead letters to their original topic (one, or
many in one statement, copied straight from their rows), walking a dead-letter topic by
its index, and deleting them. Each returns a ``Statement``;
``sqlqueue.storage.sql.dead_letters`` runs them on a Django connection."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlqueue.naming import MAX_NAME_BYTES
from sqlqueue.storage.statements.delivery import number_array
from sqlqueue.storage.statements.tables import MESSAGE_KEY, MESSAGE_TABLE
from sqlqueue.storage.statements.vendors import Statement, Vendor

#: the columns ``insert_dead_letters`` writes
DEAD_LETTER_COLUMNS = (
    "topic", "partition_key", "id", "payload", "metadata", "created_at", "published_at",
    "failed_at", "failure_count", "last_error", "original_topic", "failure_detail",
    "priority", "consumer_group",
)


#: the columns ``insert_replay`` and ``insert_replays`` write
REPLAY_COLUMNS = ("topic", "partition_key", "id", "payload", "metadata", "created_at",
                  "published_at", "priority", "consumer_group", "failure_detail")


@dataclass(frozen=True, slots=True)
class DeadLetterWrite:
    """One message's copy into its dead-letter topic (``insert_dead_letters``)."""

    offset: int  # the message's
    dead_letter_id: str
    attempts: int
    last_error: str
    detail: str  # JSON text


class DeadLetterStatements(Vendor):
    """Dead letters and replays (a mixin of ``Statements``)."""

    def insert_dead_letters(self, *, dead_letter_topic: str, group: str,
                            letters: Sequence[DeadLetterWrite]) -> Statement:
        """``insert_dead_letters``: copy messages into their dead-letter topic for one
        group (payloads copied inside the server), many in one statement (at least one),
        in offset order; dead-lettering one again updates its row (a retried write adds
        nothing). The given rows are a derived table joined to the messages by offset."""
        first = "SELECT %s AS o, %s AS i, %s AS c, %s AS e, %s AS d"
        rows = " UNION ALL ".join([first] + ["SELECT %s, %s, %s, %s, %s"] * (len(letters) - 1))
        params: list[Any] = [dead_letter_topic, group]
        for letter in letters:
            params += [letter.offset, letter.dead_letter_id, letter.attempts,
                       letter.last_error, letter.detail]
        return self._dead_letters_sql(f"({rows}) v", "v.d"), params

    def _dead_letters_sql(self, source: str, detail: str) -> str:
        """The INSERT of ``insert_dead_letters`` from ``source`` (a relation ``v`` of
        columns o: offset, i: dead-letter id, c: attempts, e: last error, d: detail)."""
        q = self.quote
        m = "m."
        clause = self.upsert_clause(MESSAGE_KEY, {
            "failed_at": f"{{new}}({q('failed_at')})",
            "failure_count": f"{{new}}({q('failure_count')})",
            "last_error": f"{{new}}({q('last_error')})",
            "failure_detail": f"{{new}}({q('failure_detail')})",
        }, table=MESSAGE_TABLE)
        # WHERE, not JOIN ... ON: SQLite's parser needs a WHERE before ON CONFLICT.
        return (
            f"INSERT INTO {q(MESSAGE_TABLE)} ({self.names(DEAD_LETTER_COLUMNS)}) "
            f"SELECT %s, {m}{q('partition_key')}, v.i, {m}{q('payload')}, {m}{q('metadata')}, "
            f"{self.message_clock_sql}, {m}{q('published_at')}, {self.now_ms_sql}, v.c, v.e, "
            f"{m}{q('topic')}, {detail}, {m}{q('priority')}, %s "
            f"FROM {source}, {q(MESSAGE_TABLE)} m WHERE {m}{q('offset')} = v.o "
            f"ORDER BY {m}{q('offset')} {clause}"
        )

    def insert_replay(self, *, dead_letter_offset: int, replay_id: str,
                      detail: str) -> Statement:
        """``insert_replay``: copy a dead letter back to its original topic, addressed to
        the group that dead-lettered it (``returning_offset_sql``: the executor reads the
        new offset)."""
        q = self.quote
        return (
            f"INSERT INTO {q(MESSAGE_TABLE)} ({self.names(REPLAY_COLUMNS)}) "
            f"SELECT {q('original_topic')}, {q('partition_key')}, %s, {q('payload')}, "
            f"{q('metadata')}, {self.message_clock_sql}, {q('published_at')}, "
            f"{q('priority')}, {q('consumer_group')}, %s FROM {q(MESSAGE_TABLE)} "
            f"WHERE {q('offset')} = %s{self.returning_offset_sql}",
            [replay_id, detail, dead_letter_offset],
        )

    def insert_replays(self, offsets: Sequence[int]) -> Statement:
        """``insert_replays``: ``insert_replay`` of the dead letters at ``offsets`` (at
        least one), copied straight from their rows in one ``INSERT ... SELECT``, in
        offset order (the copies of one partition's dead letters keep their order in the
        original topic). The copy's id and detail are made in the statement, as
        ``sqlqueue.operations.dead_letters`` makes them for one: the original id (the
        detail's ``id`` when it is a string, else the dead letter's id) with
        ``~replay-<offset>``, or its SHA-256 when that would pass ``MAX_NAME_BYTES``;
        ``{"replay_of": {"id", "offset", "dead_letter_offset"}}``."""
        q = self.quote
        m = "m."
        where, params = self._offsets_among(f"{m}{q('offset')}", offsets)
        original = self._detail_id_sql(f"{m}{q('failure_detail')}", f"{m}{q('id')}")
        offset = f"{m}{q('offset')}"
        suffix = self._concat_sql(original, "'~replay-'", offset)
        hashed = self._concat_sql("'sha256:'", self._sha256_sql(original), "'~replay-'", offset)
        replay_id = (f"CASE WHEN {self._byte_length_sql(suffix)} <= {MAX_NAME_BYTES} "
                     f"THEN {suffix} ELSE {hashed} END")
        detail = self._json_object_sql("'replay_of'", self._json_object_sql(
            "'id'", original,
            "'offset'", self._detail_offset_sql(f"{m}{q('failure_detail')}"),
            "'dead_letter_offset'", offset))
        return (
            f"INSERT INTO {q(MESSAGE_TABLE)} ({self.names(REPLAY_COLUMNS)}) "
            f"SELECT {m}{q('original_topic')}, {m}{q('partition_key')}, {replay_id}, "
            f"{m}{q('payload')}, {m}{q('metadata')}, {self.message_clock_sql}, "
            f"{m}{q('published_at')}, {m}{q('priority')}, {m}{q('consumer_group')}, {detail} "
            f"FROM {q(MESSAGE_TABLE)} m WHERE {where} AND {self._is_dead_letter_sql(m)} "
            f"ORDER BY {offset}", params)

    def dead_letter_keys(self, topic: str, after: tuple[str, int] | None,
                         limit: int) -> Statement:
        """``dead_letter_keys``: (offset, partition_key) of the next ``limit`` rows of the
        dead-letter topic ``topic`` after ``after`` (a (partition_key, offset); None: from
        the start), in the order of ``idx_topic_partition_offset`` (partition by
        partition, each oldest first): a keyset walk, each step a range of the index
        read alone, however far the walk has gone."""
        q = self.quote
        where, params = ("", []) if after is None else self._after_sql(after)
        return (f"SELECT {q('offset')}, {q('partition_key')} FROM {q(MESSAGE_TABLE)} "
                f"WHERE {q('topic')} = {self.text_mark}{where} "
                f"ORDER BY {q('topic')}, {q('partition_key')}, {q('offset')} LIMIT %s",
                [topic, *params, limit])

    def delete_dead_letters(self, offsets: Sequence[int]) -> Statement:
        """``delete_dead_letters``: remove the dead letters at ``offsets`` (at least one;
        primary-key lookups; a row that is not a dead letter stays)."""
        q = self.quote
        where, params = self._offsets_among(q("offset"), offsets)
        return (f"DELETE FROM {q(MESSAGE_TABLE)} WHERE {where} "
                f"AND {self._is_dead_letter_sql('')}", params)

    # -- the vendor's pieces of the statements above (SQLite's here) -----------------------
    def _is_dead_letter_sql(self, prefix: str) -> str:
        q = self.quote
        return f"{prefix}{q('consumer_group')} <> '' AND {prefix}{q('original_topic')} <> ''"

    def _offsets_among(self, column: str, offsets: Sequence[int]) -> tuple[str, list[Any]]:
        """``column`` among ``offsets``: primary-key lookups."""
        return f"{column} IN ({self.marks(len(offsets))})", [int(o) for o in offsets]

    def _after_sql(self, after: tuple[str, int]) -> tuple[str, list[Any]]:
        """`` AND`` (partition_key, offset) after ``after``: a row value, which SQLite and
        PostgreSQL seek in the index."""
        q = self.quote
        return (f" AND ({q('partition_key')}, {q('offset')}) > ({self.text_mark}, %s)",
                [after[0], after[1]])

    def _detail_id_sql(self, detail: str, own_id: str) -> str:
        return (f"CASE WHEN json_type({detail}, '$.id') = 'text' "
                f"THEN json_extract({detail}, '$.id') ELSE {own_id} END")

    def _detail_offset_sql(self, detail: str) -> str:
        return f"json_extract({detail}, '$.offset')"

    @staticmethod
    def _concat_sql(*parts: str) -> str:
        return " || ".join(f"({part})" for part in parts)

    @staticmethod
    def _byte_length_sql(text: str) -> str:
        return f"length(CAST({text} AS BLOB))"

    @staticmethod
    def _sha256_sql(text: str) -> str:
        # Django registers SHA256 (hex) on its SQLite connections.
        return f"SHA256({text})"

    @staticmethod
    def _json_object_sql(*parts: str) -> str:
        return f"json_object({', '.join(parts)})"


class MySQLDeadLetters(DeadLetterStatements):
    """MySQL's and MariaDB's pieces: JSON_* functions, SHA2, the keyset as an OR of
    ranges (MariaDB reads a row-value comparison as a filter, not a range)."""

    def _after_sql(self, after: tuple[str, int]) -> tuple[str, list[Any]]:
        q = self.quote
        key, text = q("partition_key"), self.text_mark
        return (f" AND ({key} > {text} OR ({key} = {text} AND {q('offset')} > %s))",
                [after[0], after[0], after[1]])

    def _detail_id_sql(self, detail: str, own_id: str) -> str:
        return (f"CASE WHEN JSON_TYPE(JSON_EXTRACT({detail}, '$.id')) = 'STRING' "
                f"THEN JSON_UNQUOTE(JSON_EXTRACT({detail}, '$.id')) ELSE {own_id} END")

    def _detail_offset_sql(self, detail: str) -> str:
        return f"JSON_EXTRACT({detail}, '$.offset')"

    @staticmethod
    def _concat_sql(*parts: str) -> str:
        return f"CONCAT({', '.join(parts)})"

    @staticmethod
    def _byte_length_sql(text: str) -> str:
        return f"LENGTH({text})"

    @staticmethod
    def _sha256_sql(text: str) -> str:
        return f"SHA2({text}, 256)"

    @staticmethod
    def _json_object_sql(*parts: str) -> str:
        return f"JSON_OBJECT({', '.join(parts)})"


class PostgreSQLDeadLetters(DeadLetterStatements):
    """PostgreSQL's: the rows' values as one array per column, read back with ``unnest``
    (one statement text for any number of rows, as ``PostgreSQLDelivery``'s)."""

    def insert_dead_letters(self, *, dead_letter_topic: str, group: str,
                            letters: Sequence[DeadLetterWrite]) -> Statement:
        return (self._dead_letters_sql(
                    "unnest(%s::bigint[], %s::text[], %s::integer[], %s::text[], %s::text[]) "
                    "AS v(o, i, c, e, d)", "v.d::jsonb"),
                [dead_letter_topic, group, [w.offset for w in letters],
                 [w.dead_letter_id for w in letters], [w.attempts for w in letters],
                 [w.last_error for w in letters], [w.detail for w in letters]])

    def _offsets_among(self, column: str, offsets: Sequence[int]) -> tuple[str, list[Any]]:
        return f"{column} = ANY(%s::bigint[])", [number_array(offsets)]

    def _detail_id_sql(self, detail: str, own_id: str) -> str:
        return (f"CASE WHEN jsonb_typeof({detail} -> 'id') = 'string' "
                f"THEN {detail} ->> 'id' ELSE {own_id} END")

    def _detail_offset_sql(self, detail: str) -> str:
        return f"{detail} -> 'offset'"

    @staticmethod
    def _byte_length_sql(text: str) -> str:
        return f"octet_length({text})"

    @staticmethod
    def _sha256_sql(text: str) -> str:
        return f"encode(sha256(convert_to({text}, 'UTF8')), 'hex')"

    @staticmethod
    def _json_object_sql(*parts: str) -> str:
        return f"jsonb_build_object({', '.join(parts)})"
