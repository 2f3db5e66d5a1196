"""The admin's log pages on a Django connection: the log's topics and partitions, a
search's lookups, the counts of topics nobody consumes, each one statement for many
topics. The statements are built once, in ``sqlqueue.storage.statements.browse``."""

from __future__ import annotations

from collections.abc import Sequence

from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.sql.tables import VendorHooks

#: topics one statement names at most (SQLite refuses compound SELECTs of more than 500
#: terms)
TOPICS_PER_STATEMENT = 200
#: parameters one statement takes at most (old SQLite builds take 999)
PARAMETERS_PER_STATEMENT = 500


class BrowseAccess(VendorHooks):
    """Mixin for ``Store``: the admin's log pages' reads."""

    def log_topics(self, cursor: CursorWrapper, limit: int) -> list[str]:
        """``log_topics``: the log's topics in order, at most ``limit``."""
        cursor.execute(*self.sql.log_topics(limit))
        return [r[0] for r in cursor.fetchall()]

    def log_partitions(self, cursor: CursorWrapper, limit: int) -> dict[str, list[str]]:
        """``log_partitions``: topic -> its partition keys, at most ``limit`` pairs."""
        cursor.execute(*self.sql.log_partitions(limit))
        found: dict[str, list[str]] = {}
        for topic, key in cursor.fetchall():
            found.setdefault(topic, []).append(key)
        return found

    def log_heads(self, cursor: CursorWrapper, limit: int) -> dict[str, dict[str, int]]:
        """``log_heads``: topic -> partition -> newest offset, at most ``limit`` pairs."""
        cursor.execute(*self.sql.log_heads(limit))
        found: dict[str, dict[str, int]] = {}
        for topic, key, head in cursor.fetchall():
            if head is not None:  # a partition emptied between the scan and its seek
                found.setdefault(topic, {})[key] = int(head)
        return found

    def newest_of_key(self, cursor: CursorWrapper, topics: Sequence[str], key: str,
                      limit: int) -> list[int]:
        """``newest_of_key`` for any number of topics (a statement per
        ``TOPICS_PER_STATEMENT``)."""
        found: list[int] = []
        for start in range(0, len(topics), TOPICS_PER_STATEMENT):
            cursor.execute(*self.sql.newest_of_key(
                topics[start:start + TOPICS_PER_STATEMENT], key, limit))
            found += [int(r[0]) for r in cursor.fetchall()]
        return found

    def offsets_of_id(self, cursor: CursorWrapper, partitions: dict[str, list[str]],
                      message_id: str) -> list[int]:
        """``offsets_of_id`` for any number of topics and partitions: a statement per
        ``PARAMETERS_PER_STATEMENT`` parameters or ``TOPICS_PER_STATEMENT`` topics
        (old SQLite builds take 999 variables and 500 compound terms)."""
        found: list[int] = []
        chunk: list[tuple[str, list[str]]] = []
        size = 0
        for topic, keys in partitions.items():
            for key in keys:
                if size + 3 > PARAMETERS_PER_STATEMENT or (
                        len(chunk) == TOPICS_PER_STATEMENT and chunk[-1][0] != topic):
                    cursor.execute(*self.sql.offsets_of_id(chunk, message_id))
                    found += [int(r[0]) for r in cursor.fetchall()]
                    chunk, size = [], 0
                if chunk and chunk[-1][0] == topic:
                    chunk[-1][1].append(key)
                    size += 1
                else:
                    chunk.append((topic, [key]))
                    size += 3
        if chunk:
            cursor.execute(*self.sql.offsets_of_id(chunk, message_id))
            found += [int(r[0]) for r in cursor.fetchall()]
        return found

    def topic_counts(self, cursor: CursorWrapper, topics: Sequence[str],
                     cap: int) -> dict[str, int]:
        """``topic_counts`` for any number of topics (a statement per
        ``TOPICS_PER_STATEMENT``): topic -> messages, counted up to ``cap``."""
        counts: dict[str, int] = {}
        for start in range(0, len(topics), TOPICS_PER_STATEMENT):
            cursor.execute(*self.sql.topic_counts(
                topics[start:start + TOPICS_PER_STATEMENT], cap))
            counts.update((topic, int(count)) for topic, count in cursor.fetchall())
        return counts
