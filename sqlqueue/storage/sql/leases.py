"""Named statements of membership: partition leases (with their fencing generation),
heartbeats, and the pauses a subscriber obeys."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.sql.tables import (
    FLOW_CONTROL_TABLE,
    HEARTBEATS_TABLE,
    LEASES_TABLE,
    OFFSETS_KEY,
    VendorHooks,
)


class LeaseStatements(VendorHooks):
    """Mixin for ``Dialect``: leases, heartbeats and pauses."""

    # leases -------------------------------------------------------------------------------
    def acquire_leases_sql(self, count: int) -> str:
        """``acquire_leases``: take partitions that have no lease, or whose lease expired
        (not renewed for ``duration_ms`` by the database clock). A live lease is left
        alone, whoever holds it. Every change of owner increments ``generation``."""
        q = self.quote
        now = self.now_ms_sql
        expired = f"{q('lease_renewed_at')} < {now} - %s"
        columns = (*OFFSETS_KEY, "leased_by", "leased_at", "lease_renewed_at", "generation")
        one = f"(%s, %s, %s, %s, {now}, {now}, 1)"
        clause = self.upsert_clause(OFFSETS_KEY, {
            # Every condition reads lease_renewed_at, which is assigned last.
            "generation": f"CASE WHEN {expired} THEN {q('generation')} + 1 "
                          f"ELSE {q('generation')} END",
            "leased_by": f"CASE WHEN {expired} THEN {{new}}({q('leased_by')}) "
                         f"ELSE {q('leased_by')} END",
            "leased_at": f"CASE WHEN {expired} THEN {now} ELSE {q('leased_at')} END",
            "lease_renewed_at": f"CASE WHEN {expired} THEN {now} "
                                f"ELSE {q('lease_renewed_at')} END",
        }, table=LEASES_TABLE)
        return (
            f"INSERT INTO {q(LEASES_TABLE)} ({', '.join(q(c) for c in columns)}) "
            f"VALUES {', '.join([one] * count)} {clause}"
        )

    def acquire_leases(
        self, cursor: CursorWrapper, group: str, topic: str, partitions: Sequence[str],
        owner: str, duration_ms: int,
    ) -> None:
        if not partitions:
            return
        params: list[Any] = []
        for partition in partitions:
            params += [group, topic, partition, owner]
        params += [duration_ms] * 4  # the four CASE conditions
        cursor.execute(self.acquire_leases_sql(len(partitions)), params)

    def _partitions_filter(self, partitions: Sequence[str] | None) -> tuple[str, list[Any]]:
        """`` AND partition_key IN (...)``: primary-key lookups, so that a locking
        statement locks those rows only (no scan of the (group, topic)'s other rows)."""
        if partitions is None:
            return "", []
        marks = ", ".join(["%s"] * len(partitions))
        return f" AND {self.quote('partition_key')} IN ({marks})", list(partitions)

    def renew_leases(
        self, cursor: CursorWrapper, group: str, topic: str, owner: str, duration_ms: int,
        *, partitions: Sequence[str] | None = None,
    ) -> int:
        """``renew_leases``: extend every lease ``owner`` still holds (only those of
        ``partitions``, when given). An expired lease is not revived (it may already be
        someone else's to take): it must be acquired again, which changes its generation."""
        if partitions is not None and not partitions:
            return 0
        q = self.quote
        now = self.now_ms_sql
        only, keys = self._partitions_filter(partitions)
        cursor.execute(
            f"UPDATE {q(LEASES_TABLE)} SET {q('lease_renewed_at')} = {now} "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s{only} "
            f"AND {q('leased_by')} = %s AND {q('lease_renewed_at')} >= {now} - %s",
            [group, topic, *keys, owner, duration_ms],
        )
        return int(cursor.rowcount)

    def list_leases(
        self, cursor: CursorWrapper, group: str, topic: str, *, lock: bool = False,
        partitions: Sequence[str] | None = None,
    ) -> list[tuple[str, str, int, int]]:
        """``list_leases``: (partition, owner, generation, ms since renewal) of every lease
        of a (group, topic), or of ``partitions`` only; primary key. ``lock``: share-lock
        them until commit (fencing: the owner cannot change while this transaction writes
        as owner)."""
        q = self.quote
        only, keys = self._partitions_filter(partitions)
        cursor.execute(
            f"SELECT {q('partition_key')}, {q('leased_by')}, {q('generation')}, "
            f"{self.now_ms_sql} - {q('lease_renewed_at')} FROM {q(LEASES_TABLE)} "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s{only}"
            + (self.locking_read_suffix if lock else ""),
            [group, topic, *keys],
        )
        return [(r[0], r[1], int(r[2]), int(r[3])) for r in cursor.fetchall()]

    def fence_leases(
        self, cursor: CursorWrapper, group: str, topic: str, partitions: Sequence[str],
    ) -> tuple[list[tuple[str, str, int, int]], str | None]:
        """``fence_leases``: ``list_leases`` of ``partitions``, share-locked until commit,
        and which server answered (None: no row, nothing to fence)."""
        q = self.quote
        only, keys = self._partitions_filter(partitions)
        cursor.execute(
            f"SELECT {q('partition_key')}, {q('leased_by')}, {q('generation')}, "
            f"{self.now_ms_sql} - {q('lease_renewed_at')}, {self.server_identity_sql} "
            f"FROM {q(LEASES_TABLE)} WHERE {q('consumer_group')} = %s AND {q('topic')} = %s"
            f"{only}{self.locking_read_suffix}",
            [group, topic, *keys],
        )
        rows = cursor.fetchall()
        server = str(rows[0][4]) if rows else None
        return [(r[0], r[1], int(r[2]), int(r[3])) for r in rows], server

    def release_leases(
        self, cursor: CursorWrapper, group: str, topic: str, partitions: Sequence[str],
        owner: str,
    ) -> int:
        """``release_leases``: give partitions up (only those ``owner`` holds)."""
        if not partitions:
            return 0
        q = self.quote
        marks = ", ".join(["%s"] * len(partitions))
        cursor.execute(
            f"DELETE FROM {q(LEASES_TABLE)} WHERE {q('consumer_group')} = %s AND "
            f"{q('topic')} = %s AND {q('leased_by')} = %s AND {q('partition_key')} IN ({marks})",
            [group, topic, owner, *partitions],
        )
        return int(cursor.rowcount)

    def purge_abandoned(
        self, cursor: CursorWrapper, group: str, topic: str, older_than_ms: int
    ) -> None:
        """``purge_abandoned``: forget leases and heartbeats nobody renewed for a long
        time. Runs long after such leases could be taken over, so the work of a dead
        subscriber is always recovered before it is forgotten."""
        q = self.quote
        now = self.now_ms_sql
        cursor.execute(
            f"DELETE FROM {q(LEASES_TABLE)} WHERE {q('consumer_group')} = %s AND "
            f"{q('topic')} = %s AND {q('lease_renewed_at')} < {now} - %s",
            [group, topic, older_than_ms],
        )
        cursor.execute(
            f"DELETE FROM {q(HEARTBEATS_TABLE)} WHERE {q('consumer_group')} = %s AND "
            f"{q('topic')} = %s AND {q('heartbeat_at')} < {now} - %s",
            [group, topic, older_than_ms],
        )

    # heartbeats ---------------------------------------------------------------------------
    def heartbeat(self, cursor: CursorWrapper, group: str, topic: str, name: str) -> None:
        """``heartbeat``: this subscriber is alive (database time)."""
        q = self.quote
        now = self.now_ms_sql
        columns = ("consumer_group", "topic", "subscriber_name", "heartbeat_at",
                   "deregistered_at")
        clause = self.upsert_clause(("consumer_group", "topic", "subscriber_name"), {
            "heartbeat_at": f"{{new}}({q('heartbeat_at')})",
            "deregistered_at": "0",
        }, table=HEARTBEATS_TABLE)
        cursor.execute(
            f"INSERT INTO {q(HEARTBEATS_TABLE)} ({', '.join(q(c) for c in columns)}) "
            f"VALUES (%s, %s, %s, {now}, 0) {clause}",
            [group, topic, name],
        )

    def live_subscribers(
        self, cursor: CursorWrapper, group: str, topic: str, within_ms: int
    ) -> list[str]:
        """``live_subscribers``: names with a heartbeat in the last ``within_ms``."""
        q = self.quote
        cursor.execute(
            f"SELECT {q('subscriber_name')} FROM {q(HEARTBEATS_TABLE)} WHERE "
            f"{q('consumer_group')} = %s AND {q('topic')} = %s AND "
            f"{q('heartbeat_at')} >= {self.now_ms_sql} - %s AND {q('deregistered_at')} = 0 "
            f"ORDER BY {q('subscriber_name')}",
            [group, topic, within_ms],
        )
        return [r[0] for r in cursor.fetchall()]

    def deregister(self, cursor: CursorWrapper, group: str, topic: str, name: str) -> None:
        """``deregister``: a graceful goodbye, so the others rebalance at once."""
        q = self.quote
        cursor.execute(
            f"DELETE FROM {q(HEARTBEATS_TABLE)} WHERE {q('consumer_group')} = %s AND "
            f"{q('topic')} = %s AND {q('subscriber_name')} = %s",
            [group, topic, name],
        )

    # flow control ----------------------------------------------------------------------------
    def list_pauses(self, cursor: CursorWrapper) -> list[tuple[str, str]]:
        """``list_pauses``: every pause, as (group, topic); "" matches any. The table holds
        one row per pause an operator made (a handful), read whole."""
        q = self.quote
        cursor.execute(f"SELECT {q('consumer_group')}, {q('topic')} FROM "
                       f"{q(FLOW_CONTROL_TABLE)}")
        return [(str(group), str(topic)) for group, topic in cursor.fetchall()]
