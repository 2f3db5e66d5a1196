"""Dead letters on a Django connection: copying failed messages into their dead-letter
topic, replaying dead letters, deleting them. The statements are built once, in
``sqlqueue.storage.statements.dead_letters``; these methods run them, cut to the
database's limits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.chunks import statement_chunks
from sqlqueue.storage.sql.tables import DeadLetterWrite, VendorHooks


def _written_bytes(row: DeadLetterWrite) -> int:
    """What a dead letter adds to its statement, as escaped literals at worst (its texts
    twice over, and room for the numbers and the row's SQL)."""
    texts = (row.dead_letter_id, row.last_error, row.detail)
    return 2 * sum(len(text.encode("utf-8")) for text in texts) + 256


class DeadLetterAccess(VendorHooks):
    """Mixin for ``Store``: dead letters and replays."""

    if TYPE_CHECKING:  # PublishingAccess's limits (a Store has both mixins)
        max_rows_per_insert: int

        def max_query_params(self) -> int: ...
        def max_statement_bytes(self) -> int: ...

    def insert_dead_letters(
        self, cursor: CursorWrapper, *, dead_letter_topic: str, group: str,
        letters: Sequence[DeadLetterWrite],
    ) -> None:
        """``insert_dead_letters``, in as many statements as the database's limits on
        parameters and statement size ask for (``dead_letter_chunks``); none for none."""
        for chunk in self.dead_letter_chunks(letters):
            self.execute_rows(cursor, *self.sql.insert_dead_letters(
                dead_letter_topic=dead_letter_topic, group=group, letters=chunk))

    def dead_letter_chunks(self, letters: Sequence[DeadLetterWrite]) -> list[list[DeadLetterWrite]]:
        """``letters`` cut to the statements' limits: at most
        ``max_rows_per_insert`` rows, 5 parameters each, under ``max_statement_bytes``
        (their texts counted as they travel)."""
        max_rows = max(1, min(self.max_rows_per_insert, self.max_query_params() // 5))
        return list(statement_chunks(letters, max_rows=max_rows,
                                     max_bytes=self.max_statement_bytes(),
                                     size_of=_written_bytes))

    def offsets_per_statement(self) -> int:
        """The most offsets ``insert_replays`` and ``delete_dead_letters`` take in one
        statement on this connection (SQLite's limit on parameters; the others travel as
        one array or inline)."""
        return max(1, self.max_query_params() - 8)

    def delete_dead_letters(self, cursor: CursorWrapper, offsets: Sequence[int]) -> int:
        """``delete_dead_letters`` (at most ``offsets_per_statement``); returns how many
        rows went."""
        if not offsets:
            return 0
        self.execute_rows(cursor, *self.sql.delete_dead_letters(offsets))
        return int(cursor.rowcount)

    def insert_replays(self, cursor: CursorWrapper, offsets: Sequence[int]) -> int:
        """``insert_replays`` of the dead letters at ``offsets`` (at most
        ``offsets_per_statement``); returns how many rows were inserted."""
        if not offsets:
            return 0
        self.execute_rows(cursor, *self.sql.insert_replays(offsets))
        return int(cursor.rowcount)

    def dead_letter_keys(self, cursor: CursorWrapper, topic: str,
                         after: tuple[str, int] | None, limit: int) -> list[tuple[int, str]]:
        """``dead_letter_keys``: the next (offset, partition_key)s of a dead-letter
        topic's keyset walk."""
        cursor.execute(*self.sql.dead_letter_keys(topic, after, limit))
        return [(int(offset), str(key)) for offset, key in cursor.fetchall()]

    def insert_replay(
        self, cursor: CursorWrapper, *, dead_letter_offset: int, replay_id: str, detail: str
    ) -> int:
        """``insert_replay``: copy a dead letter back to its original topic, addressed to
        the group that dead-lettered it; returns the new offset."""
        cursor.execute(*self.sql.insert_replay(dead_letter_offset=dead_letter_offset,
                                               replay_id=replay_id, detail=detail))
        return self.last_inserted_offset(cursor)
