"""Named statements of dead letters: copying failed messages into their dead-letter
topic (many in one statement), replaying dead letters to their original topic (one, or
many in one statement) and deleting them. Each returns a ``Statement``;
``sqlqueue.storage.sql.dead_letters`` runs them on a Django connection."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlqueue.storage.statements.tables import MESSAGE_KEY, MESSAGE_TABLE
from sqlqueue.storage.statements.vendors import Statement, Vendor

#: the columns ``insert_dead_letters`` writes
DEAD_LETTER_COLUMNS = (
    "topic", "partition_key", "id", "payload", "metadata", "created_at", "published_at",
    "failed_at", "failure_count", "last_error", "original_topic", "failure_detail",
    "priority", "consumer_group",
)


#: the columns ``insert_replay`` writes
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


@dataclass(frozen=True, slots=True)
class ReplayWrite:
    """One dead letter's copy back to its original topic (``insert_replays``)."""

    dead_letter_offset: int
    replay_id: str
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

    def insert_replays(self, replays: Sequence[ReplayWrite]) -> Statement:
        """``insert_replays``: ``insert_replay`` of many dead letters in one statement
        (at least one), in the dead letters' offset order: the copies of one partition's
        dead letters keep their order in the original topic."""
        first = "SELECT %s AS o, %s AS i, %s AS d"
        rows = " UNION ALL ".join([first] + ["SELECT %s, %s, %s"] * (len(replays) - 1))
        params: list[Any] = []
        for replay in replays:
            params += [replay.dead_letter_offset, replay.replay_id, replay.detail]
        return self._replays_sql(f"({rows}) v", "v.d"), params

    def _replays_sql(self, source: str, detail: str) -> str:
        q = self.quote
        m = "m."
        return (
            f"INSERT INTO {q(MESSAGE_TABLE)} ({self.names(REPLAY_COLUMNS)}) "
            f"SELECT {m}{q('original_topic')}, {m}{q('partition_key')}, v.i, "
            f"{m}{q('payload')}, {m}{q('metadata')}, {self.message_clock_sql}, "
            f"{m}{q('published_at')}, {m}{q('priority')}, {m}{q('consumer_group')}, {detail} "
            f"FROM {source}, {q(MESSAGE_TABLE)} m WHERE {m}{q('offset')} = v.o "
            f"ORDER BY {m}{q('offset')}"
        )

    def delete_dead_letters(self, offsets: Sequence[int]) -> Statement:
        """``delete_dead_letters``: remove the dead letters at ``offsets`` (at least one;
        primary-key lookups; a row that is not a dead letter stays)."""
        q = self.quote
        return (f"DELETE FROM {q(MESSAGE_TABLE)} WHERE {q('offset')} IN "
                f"({self.marks(len(offsets))}) AND {q('consumer_group')} <> '' "
                f"AND {q('original_topic')} <> ''", list(offsets))


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

    def insert_replays(self, replays: Sequence[ReplayWrite]) -> Statement:
        return (self._replays_sql("unnest(%s::bigint[], %s::text[], %s::text[]) AS v(o, i, d)",
                                  "v.d::jsonb"),
                [[r.dead_letter_offset for r in replays], [r.replay_id for r in replays],
                 [r.detail for r in replays]])
