"""Named statements the operator's pages and commands read (the lag dashboard, metrics,
``manage.py queue status``). Every one is bounded: one seek per partition, or a scan cut
at a cap. ``sqlqueue.storage.sql.operating`` runs them on a Django connection; the
vendors' ``partition_heads`` and ``offset_counter`` belong here too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlqueue.storage.statements.tables import MESSAGE_TABLE, STATE_TABLE
from sqlqueue.storage.statements.vendors import Statement, Vendor


class OperatingStatements(Vendor):
    """The operator's reads, for any vendor (a mixin of ``Statements``)."""

    def pending_summary(self, topic: str, group: str, watermarks: Sequence[tuple[str, int]],
                        cap: int | None) -> Statement:
        """``pending_summary``: for each (partition, watermark) of a topic (at least
        one), a row (partition, count, due): the messages above the watermark, counted up
        to ``cap`` (None: not counted; replays addressed to other groups and messages the
        group acked are counted too: the caller subtracts those), and since when the
        group's first one is due. Each partition is a bounded range of
        ``idx_topic_partition_offset`` (at most ``cap`` index entries) plus primary-key
        lookups of the first rows."""
        params: list[Any] = []
        for key, watermark in watermarks:
            params += [key, *self._pending_params(topic, group, key, watermark, cap)]
        return (" UNION ALL ".join([f"SELECT %s, {self._pending_sql(cap)}"]
                                   * len(watermarks)), params)

    def pending_summaries(self, probes: Sequence[tuple[str, str, str, int]],
                          cap: int | None) -> Statement:
        """``pending_summaries``: ``pending_summary`` of many topics and groups at once:
        for each (topic, group, partition, watermark) of ``probes`` (at least one), a row
        (topic, group, partition, count, due), each the same bounded range and lookups
        (issue 52: the lag of 1,500 subscribed topics, a statement per topic, took 15 s
        and more)."""
        params: list[Any] = []
        for topic, group, key, watermark in probes:
            params += [topic, group, key,
                       *self._pending_params(topic, group, key, watermark, cap)]
        return (" UNION ALL ".join([f"SELECT %s, %s, %s, {self._pending_sql(cap)}"]
                                   * len(probes)), params)

    def _pending_sql(self, cap: int | None, refs: tuple[str, str, str, str] | None = None
                     ) -> str:
        """The count and the due time of one partition's pending messages (parameters:
        ``_pending_params``; ``refs``: the topic, partition key, watermark and group as
        expressions instead, the cap the only parameter)."""
        q = self.quote
        offset = q("offset")
        text = self.text_mark
        topic, key, watermark, _ = refs or (text, text, "%s", text)
        above = (f"FROM {q(MESSAGE_TABLE)} {self.offset_index_hint} WHERE {q('topic')} = {topic} "
                 f"AND {q('partition_key')} = {key} AND {offset} > {watermark}")
        # ORDER BY the index's last column: PostgreSQL, which takes no index hint, then
        # reads the range of idx_topic_partition_offset and stops at the cap.
        tally = (f"(SELECT COUNT(*) FROM (SELECT 1 AS one {above} ORDER BY {offset} "
                 f"LIMIT %s) capped)" if cap is not None else "NULL")
        return f"{tally}, {self._first_pending_sql(refs)}"

    @staticmethod
    def _pending_params(topic: str, group: str, key: str, watermark: int,
                        cap: int | None) -> list[Any]:
        bounds = [topic, key, watermark]
        return [*([*bounds, cap] if cap is not None else []), *bounds, group, group]

    def _first_pending_sql(self, refs: tuple[str, str, str, str] | None = None) -> str:
        """The due time of the group's first message above a watermark. Skipped: replays
        addressed to other groups, and messages the group acked whose watermark has not
        passed them yet (the write horizon holds it back for a while, also after a
        ``runconsumer --until-empty`` left): both are rare, so this reads one row or a
        few. Parameters: topic, partition key, watermark, group, group."""
        q = self.quote
        m, offset, text = q("m"), q("offset"), self.text_mark
        topic, key, watermark, group = refs or (text, text, "%s", text)
        due = self.greatest_sql(f"{m}.{q('created_at')}", f"{m}.{q('deliver_after')}")
        acked = (f"SELECT 1 FROM {q(STATE_TABLE)} s WHERE s.{q('consumer_group')} = {group} "
                 f"AND s.{q('topic')} = {m}.{q('topic')} "
                 f"AND s.{q('partition_key')} = {m}.{q('partition_key')} "
                 f"AND s.{q('message_offset')} = {m}.{offset} AND s.{q('acked')}")
        return (f"(SELECT {due} FROM {q(MESSAGE_TABLE)} {m} {self.offset_index_hint} "
                f"WHERE {m}.{q('topic')} = {topic} AND {m}.{q('partition_key')} = {key} "
                f"AND {m}.{offset} > {watermark} AND {m}.{q('consumer_group')} IN ('', {group}) "
                f"AND NOT EXISTS ({acked}) ORDER BY {m}.{offset} LIMIT 1)")

    def first_offsets_above(self, topic: str,
                            pairs: Sequence[tuple[str, int]]) -> Statement:
        """``first_offsets_above``: for (partition, watermark) pairs of a topic (at least
        one), the first stored offset above the watermark, as one row of as many
        columns. Each is a ``seek_sql`` in ``idx_topic_partition_offset`` with constant
        bounds, one index dive (MySQL's while planning): the cheapest probe there is,
        for reads that cover many groups at once (the columns of one row cost less to
        plan than a UNION of as many rows; reading the rows themselves is left to
        ``message_dues``, which costs less than a lookup inside each probe)."""
        q = self.quote
        text = self.text_mark
        probe = self.seek_sql(q("offset"), f"{q('topic')} = {text} "
                                           f"AND {q('partition_key')} = {text} "
                                           f"AND {q('offset')} > %s")
        return ("SELECT " + ", ".join([probe] * len(pairs)),
                [value for key, watermark in pairs for value in (topic, key, watermark)])

    def message_dues(self, offsets: Sequence[int]) -> Statement:
        """``message_dues``: when each message of ``offsets`` (not empty) is due (stored,
        and past its ``deliver_after``) and which group it is addressed to ('' for every
        group); by primary key. The offsets are written in (integers: nothing to
        escape): a scrape asks for thousands, and binding each costs the driver more
        than the server."""
        q = self.quote
        due = self.greatest_sql(q("created_at"), q("deliver_after"))
        return (f"SELECT {q('offset')}, {due}, {q('consumer_group')} FROM {q(MESSAGE_TABLE)} "
                f"WHERE {q('offset')} IN ({', '.join(str(int(o)) for o in offsets)})", [])

    def acked_among(self, group: str, topic: str, pairs: Sequence[tuple[str, int]],
                    lock: bool = False) -> Statement:
        """``acked_among``: which of the (partition, offset) pairs (at least one) the
        group has acked (delivery state, by primary key). ``lock``: a locking read, as of
        now rather than the transaction's snapshot (a pass that marked the rows reads
        what its marking found: an atomic handler's commit)."""
        q = self.quote
        terms = " OR ".join([f"({q('partition_key')} = {self.text_mark} "
                             f"AND {q('message_offset')} = %s)"]
                            * len(pairs))
        return (f"SELECT {q('partition_key')}, {q('message_offset')} FROM {q(STATE_TABLE)} "
                f"WHERE {q('consumer_group')} = {self.text_mark} "
                f"AND {q('topic')} = {self.text_mark} AND ({terms}) "
                f"AND {q('acked')} = %s{self.locking_read_suffix if lock else ''}",
                [group, topic, *(v for pair in pairs for v in pair), True])

    def dead_letter_tallies(self, pairs: Sequence[tuple[str, str]], cap: int) -> Statement:
        """``dead_letter_tallies``: ``dead_letter_counts`` of many (dead-letter topic,
        group) ``pairs`` (at least one) at once, as rows (topic, group, partition,
        count): each pair's capped range of ``idx_group_topic_offset``, in a UNION ALL."""
        q = self.quote
        text = self.text_mark
        one = (f"SELECT %s, %s, {q('partition_key')}, COUNT(*) FROM (SELECT "
               f"{q('partition_key')} FROM {q(MESSAGE_TABLE)} WHERE {q('topic')} = {text} "
               f"AND {q('consumer_group')} = {text} LIMIT %s) capped "
               f"GROUP BY {q('partition_key')}")
        params: list[Any] = []
        for topic, group in pairs:
            params += [topic, group, topic, group, cap]
        return " UNION ALL ".join([self.union_member(one)] * len(pairs)), params

    def _probe_select(self, kinds: str, rows: Sequence[Sequence[Any]]) -> Statement:
        """A SELECT of ``rows`` as columns n (the row's number), c0, c1...; ``kinds``
        one letter a column, ``t`` text, ``i`` integer. Each row a constant SELECT, in a
        UNION ALL: planned once, unlike a member that reads a table."""
        marks = [self.text_mark if kind == "t" else "%s" for kind in kinds]
        first = ", ".join(["%s AS n", *(f"{m} AS c{i}" for i, m in enumerate(marks))])
        following = ", ".join(["%s", *marks])
        return (" UNION ALL ".join([f"SELECT {first}"]
                                   + [f"SELECT {following}"] * (len(rows) - 1)),
                [v for n, row in enumerate(rows) for v in (n, *row)])

    def _nth_sql(self, n: int, newest: bool) -> str:
        """The ``n``-th newest (or oldest) offset of the probe's partition (p.c0 topic,
        p.c2 key), NULL if it holds fewer: a range of ``idx_topic_partition_offset``
        from one end that reads at most ``n`` index entries."""
        q = self.quote
        # The index's columns: PostgreSQL, planning for any topic, then takes the index
        # (a rare topic's rows are not found by walking the primary key).
        order = ", ".join(f"m.{q(c)}{' DESC' if newest else ''}"
                          for c in ("topic", "partition_key", "offset"))
        return (f"(SELECT m.{q('offset')} FROM {q(MESSAGE_TABLE)} m {self.offset_index_hint} "
                f"WHERE m.{q('topic')} = p.c0 AND m.{q('partition_key')} = p.c2 "
                f"ORDER BY {order} LIMIT 1 OFFSET {int(n) - 1})")

    def pending_where_cheap(self, probes: Sequence[tuple[str, str, str, int]],
                            cap: int) -> Statement:
        """``pending_where_cheap``: for each (topic, group, partition, watermark) of
        ``probes`` (at least one), a row (its number in ``probes``, count, due) as
        ``pending_summaries`` answers (the messages above the watermark counted up to
        ``cap``, since when the group's first one is due) where that is cheap: the
        partition holds fewer than ``cap`` messages (all counted), or all of them are
        above the watermark (``cap`` or more: ``cap``); elsewhere NULL, NULL (the caller
        probes those apart). Planned once for all the probes; each correlated subquery
        reads by (topic, partition) from one end of the partition, at most ``cap``
        index entries (MariaDB does not range-scan a correlated ``offset > watermark``:
        it reads from the partition's start; issue 52: a planned UNION member per probe
        cost 1-5 ms, 1,500 lagging topics 1-3 s)."""
        q = self.quote
        count = (f"(SELECT COUNT(*) FROM {q(MESSAGE_TABLE)} m {self.offset_index_hint} "
                 f"WHERE m.{q('topic')} = p.c0 AND m.{q('partition_key')} = p.c2 "
                 f"AND m.{q('offset')} > p.c3)")
        few = f"{self._nth_sql(cap, newest=True)} IS NULL"
        above = f"{self._nth_sql(1, newest=False)} > p.c3"
        due = self._first_pending_sql(("p.c0", "p.c2", "p.c3", "p.c1"))
        rows, params = self._probe_select("ttti", probes)
        # Each end read once a probe where it can be: the first message's end before the
        # newest ``cap`` entries (OR stops at its first true term).
        return (f"SELECT p.n, CASE WHEN {above} THEN CASE WHEN {few} THEN {count} "
                f"ELSE {int(cap)} END WHEN {few} THEN {count} END, "
                f"CASE WHEN {above} OR {few} THEN {due} END FROM ({rows}) p", params)

    def dead_letters_if_few(self, pairs: Sequence[tuple[str, str]], cap: int) -> Statement:
        """``dead_letters_if_few``: for each (dead-letter topic, group) of ``pairs`` (at
        least one) with fewer than ``cap`` dead letters, rows (its number in ``pairs``,
        partition, count), all counted; for each with ``cap`` or more, one row (number,
        NULL, 0) (the caller counts those apart, ``dead_letter_tallies``); a pair without
        any has no row. The pairs' ranges of ``idx_group_topic_offset``, planned once
        (MariaDB planned a member a pair in ``dead_letter_tallies``: 0.5-5 ms each)."""
        q = self.quote
        nth = (f"(SELECT m.{q('offset')} FROM {q(MESSAGE_TABLE)} m {self.group_index_hint} "
               f"WHERE {self._of_pair_sql('m.')} "
               f"ORDER BY {self.names(('consumer_group', 'topic', 'offset'), 'm.')} "
               f"LIMIT 1 OFFSET {int(cap) - 1})")
        rows, params = self._probe_select("tt", pairs)
        return (f"WITH p AS ({rows}) "
                f"SELECT p.n, NULL, 0 FROM p WHERE {nth} IS NOT NULL "
                f"UNION ALL SELECT p.n, m.{q('partition_key')}, COUNT(*) FROM p "
                f"{self._rows_of_pair_sql(cap)} WHERE {nth} IS NULL "
                f"GROUP BY p.n, m.{q('partition_key')}", params)

    def _of_pair_sql(self, prefix: str = "") -> str:
        """The rows of the pair (p.c0 topic, p.c1 group)."""
        q = self.quote
        return (f"{prefix}{q('consumer_group')} = p.c1 AND {prefix}{q('topic')} = p.c0")

    def _rows_of_pair_sql(self, cap: int) -> str:
        """The join of a pair (p.c0 topic, p.c1 group) to its rows, ``m``."""
        q = self.quote
        return (f"JOIN {q(MESSAGE_TABLE)} m {self.group_index_hint} "
                f"ON m.{q('consumer_group')} = p.c1 AND m.{q('topic')} = p.c0")

    def dead_letter_counts(self, dead_letter_topic: str, group: str, cap: int) -> Statement:
        """``dead_letter_counts``: dead letters of one group per partition of a
        dead-letter topic, counted over at most ``cap`` rows (``idx_topic_partition_offset``
        range)."""
        q = self.quote
        return (
            f"SELECT {q('partition_key')}, COUNT(*) FROM (SELECT {q('partition_key')} "
            f"FROM {q(MESSAGE_TABLE)} WHERE {q('topic')} = {self.text_mark} "
            f"AND {q('consumer_group')} = {self.text_mark} "
            f"LIMIT %s) capped GROUP BY {q('partition_key')}",
            [dead_letter_topic, group, cap],
        )


class PostgreSQLOperating(OperatingStatements):
    """PostgreSQL plans each member of a UNION ALL apart: 200 probes planned took seconds
    (issue 52: the lag of 1,500 subscribed topics, 30-44 s). The probes travel as arrays
    instead, and each subquery is planned once for all of them."""

    def pending_summaries(self, probes: Sequence[tuple[str, str, str, int]],
                          cap: int | None) -> Statement:
        topics, groups, keys, watermarks = (list(c) for c in zip(*probes, strict=True))
        refs = ("p.t", "p.k", "p.w", "p.g")
        return (f"SELECT p.t, p.g, p.k, {self._pending_sql(cap, refs)} FROM "
                f"unnest(%s::text[], %s::text[], %s::text[], %s::bigint[]) AS p(t, g, k, w)",
                [*([cap] if cap is not None else []), topics, groups, keys, watermarks])

    def set_jit(self, setting: str) -> Statement:
        """``set_jit``: PostgreSQL's ``jit`` setting for the rest of the transaction
        (``set_config(..., true)``, as ``SET LOCAL``), and the one it had, as a row.
        The planner prices the probes of many partitions at hundreds of thousands and
        JIT-compiles them: 0.05-0.42 s of a 0.07-0.47 s statement (issue 52)."""
        return "SELECT current_setting('jit'), set_config('jit', %s, true)", [setting]

    def _of_pair_sql(self, prefix: str = "") -> str:
        # The topic as a range of one value: equalities to parameters make the group and
        # the topic constants of the ORDER BY, which the primary key then gives (offset
        # order), and PostgreSQL, planning for any pair, walked the primary key of the
        # whole log for a rare one. With the range, idx_group_topic_offset is the only
        # index in the order asked for, and its scan still starts at (group, topic) and
        # stops after the topic (the group's equality comes first).
        q = self.quote
        topic = f"{prefix}{q('topic')}"
        return f"{prefix}{q('consumer_group')} = p.c1 AND {topic} >= p.c0 AND {topic} <= p.c0"

    def _rows_of_pair_sql(self, cap: int) -> str:
        # A lateral subquery with a LIMIT (the pair has fewer rows: nothing is cut), in
        # the index's order: a join, or a bare LIMIT, the planner made a Seq Scan of the
        # log (it cannot see the pairs in the arrays; most rows have group '').
        q = self.quote
        return (f"CROSS JOIN LATERAL (SELECT {q('partition_key')} FROM {q(MESSAGE_TABLE)} "
                f"WHERE {self._of_pair_sql()} ORDER BY "
                f"{self.names(('consumer_group', 'topic', 'offset'))} LIMIT {int(cap)}) m")

    def _probe_select(self, kinds: str, rows: Sequence[Sequence[Any]]) -> Statement:
        # One array a column: the statement's text does not grow with the probes.
        types = ["text" if kind == "t" else "bigint" for kind in kinds]
        arrays = ", ".join(["%s::bigint[]", *(f"%s::{t}[]" for t in types)])
        names = ", ".join(["n", *(f"c{i}" for i in range(len(kinds)))])
        return (f"SELECT * FROM unnest({arrays}) AS u({names})",
                [list(range(len(rows))), *(list(c) for c in zip(*rows, strict=True))])

    def dead_letter_tallies(self, pairs: Sequence[tuple[str, str]], cap: int) -> Statement:
        q = self.quote
        topics, groups = (list(c) for c in zip(*pairs, strict=True))
        return (f"SELECT p.t, p.g, c.k, COUNT(*) FROM unnest(%s::text[], %s::text[]) "
                f"AS p(t, g) CROSS JOIN LATERAL (SELECT {q('partition_key')} AS k "
                f"FROM {q(MESSAGE_TABLE)} WHERE {q('topic')} = p.t "
                f"AND {q('consumer_group')} = p.g LIMIT %s) c GROUP BY p.t, p.g, c.k",
                [topics, groups, cap])
