"""Named statements the admin's log pages read (``sqlqueue.operations.log_browse``): the
log's topics and partitions, and a search's lookups, each one round trip whatever the
number of topics (issue 52: with 1,500 topics the pages made one round trip per topic,
three per topic for a search, and took over a second for that alone).

Every statement reads an index in order: a loose index scan of
``idx_topic_partition_offset`` (one seek per topic or partition), or equality lookups of
a topic's rows in ``idx_topic_partition_offset`` / ``idx_topic_partition_id``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlqueue.storage.statements.tables import MESSAGE_TABLE
from sqlqueue.storage.statements.vendors import Statement, Vendor


class BrowseStatements(Vendor):
    """The log pages' reads, for PostgreSQL and SQLite (a recursive query makes the
    loose index scan); MySQL/MariaDB's in ``MySQLBrowse``."""

    def topics_cte(self) -> str:
        """``topics(t)``: the log's topics, one seek of ``idx_topic_partition_offset``
        each (the last row's ``t`` is NULL)."""
        topic = self.quote("topic")
        return (f"topics(t) AS (SELECT {self.seek_sql(topic, '1 = 1')} "
                f"UNION ALL SELECT {self.seek_sql(topic, f'{topic} > topics.t')} "
                f"FROM topics WHERE topics.t IS NOT NULL)")

    def log_topics(self, limit: int) -> Statement:
        """``log_topics``: the distinct topics of the log in their order, at most
        ``limit``, by a loose index scan (one seek per topic)."""
        return (f"WITH RECURSIVE {self.topics_cte()} "
                f"SELECT t FROM topics WHERE t IS NOT NULL ORDER BY t LIMIT %s", [limit])

    def log_partitions(self, limit: int) -> Statement:
        """``log_partitions``: the distinct (topic, partition key) pairs of the log in
        their order, at most ``limit``, by a loose index scan (one seek per pair)."""
        q = self.quote
        topic, key = q("topic"), q("partition_key")
        first = self.seek_sql(key, f"{topic} = topics.t")
        following = self.seek_sql(key, f"{topic} = pairs.t AND {key} > pairs.k")
        return (f"WITH RECURSIVE {self.topics_cte()}, pairs(t, k) AS ("
                f"SELECT t, {first} FROM topics WHERE t IS NOT NULL "
                f"UNION ALL SELECT t, {following} FROM pairs WHERE pairs.k IS NOT NULL) "
                f"SELECT t, k FROM pairs WHERE k IS NOT NULL ORDER BY t, k LIMIT %s", [limit])

    def log_heads(self, limit: int) -> Statement:
        """``log_heads``: (topic, partition key, newest offset) of every partition of
        the log, at most ``limit``, in order: ``log_partitions``' loose index scan and
        one MAX seek per pair (the lag of every subscribed topic in one statement)."""
        q = self.quote
        topic, key, offset = q("topic"), q("partition_key"), q("offset")
        partitions, params = self.log_partitions(limit)
        newest = self.seek_sql(offset, f"{topic} = p.t AND {key} = p.k", last=True)
        return f"SELECT p.t, p.k, {newest} FROM ({partitions}) p", params

    def newest_of_key(self, topics: Sequence[str], key: str, limit: int) -> Statement:
        """``newest_of_key``: the offsets of the newest ``limit`` messages of partition
        ``key`` in each of ``topics`` (at least one): a backwards range of
        ``idx_topic_partition_offset`` per topic, in a UNION ALL."""
        q = self.quote
        one = (f"SELECT {q('offset')} FROM {q(MESSAGE_TABLE)} "
               f"WHERE {q('topic')} = {self.text_mark} AND {q('partition_key')} = "
               f"{self.text_mark} ORDER BY {q('offset')} DESC LIMIT %s")
        params: list[Any] = []
        for topic in topics:
            params += [topic, key, limit]
        return " UNION ALL ".join([self.union_member(one)] * len(topics)), params

    def topic_counts(self, topics: Sequence[str], cap: int) -> Statement:
        """``topic_counts``: (topic, its messages counted up to ``cap``) of each of
        ``topics`` (at least one): a range of ``idx_topic_partition_offset`` per topic,
        cut at the cap, in a UNION ALL."""
        q = self.quote
        one = (f"SELECT %s, (SELECT COUNT(*) FROM (SELECT 1 AS one "
               f"FROM {q(MESSAGE_TABLE)} WHERE {q('topic')} = {self.text_mark} LIMIT %s) capped)")
        params: list[Any] = []
        for topic in topics:
            params += [topic, topic, cap]
        return " UNION ALL ".join([one] * len(topics)), params

    def offsets_of_id(self, partitions: Sequence[tuple[str, Sequence[str]]],
                      message_id: str) -> Statement:
        """``offsets_of_id``: the offsets of the messages with id ``message_id`` in
        each (topic, its partition keys) of ``partitions`` (at least one, each with
        keys): lookups of ``idx_topic_partition_id``, in a UNION ALL."""
        q = self.quote
        members, params = [], []
        for topic, keys in partitions:
            members.append(f"SELECT {q('offset')} FROM {q(MESSAGE_TABLE)} "
                           f"WHERE {q('topic')} = {self.text_mark} AND {q('partition_key')} "
                           f"IN ({self.text_marks(len(keys))}) AND {q('id')} = "
                           f"{self.text_mark}")
            params += [topic, *keys, message_id]
        return " UNION ALL ".join(members), params


class MySQLBrowse(BrowseStatements):
    """MySQL/MariaDB answer a GROUP BY of an index's first columns with a loose index
    scan ("Using index for group-by"); their recursive queries are no faster."""

    def log_topics(self, limit: int) -> Statement:
        topic = self.quote("topic")
        return (f"SELECT {topic} FROM {self.quote(MESSAGE_TABLE)} GROUP BY {topic} "
                f"ORDER BY {topic} LIMIT %s", [limit])

    def log_partitions(self, limit: int) -> Statement:
        columns = self.names(("topic", "partition_key"))
        return (f"SELECT {columns} FROM {self.quote(MESSAGE_TABLE)} GROUP BY {columns} "
                f"ORDER BY {columns} LIMIT %s", [limit])

    def log_heads(self, limit: int) -> Statement:
        # MAX of the index's last column, grouped by the ones before it: the same loose
        # index scan ("Using index for group-by").
        columns = self.names(("topic", "partition_key"))
        return (f"SELECT {columns}, MAX({self.quote('offset')}) FROM "
                f"{self.quote(MESSAGE_TABLE)} GROUP BY {columns} ORDER BY {columns} LIMIT %s",
                [limit])


class PostgreSQLBrowse(BrowseStatements):
    """PostgreSQL plans each member of a UNION ALL apart: 200 counts planned took longer
    than counted (0.1-0.4 s a statement on a busy machine). The topics travel as one
    array instead, and the capped count is planned once."""

    def topic_counts(self, topics: Sequence[str], cap: int) -> Statement:
        # ORDER BY the index's columns after the topic: planned once for any topic,
        # PostgreSQL guesses the average topic's rows and, without it, scanned the log
        # for a rare one (issue 52's plan tests); with it, only the index gives the order.
        q = self.quote
        return (f"SELECT t, (SELECT COUNT(*) FROM (SELECT 1 AS one FROM {q(MESSAGE_TABLE)} "
                f"WHERE {q('topic')} = t ORDER BY {q('partition_key')}, {q('offset')} "
                f"LIMIT %s) capped) FROM unnest(%s::text[]) AS n(t)",
                [cap, list(topics)])
