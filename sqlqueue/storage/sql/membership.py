"""Membership on a Django connection: partition leases (with their fencing generation),
heartbeats, and the pauses a subscriber obeys. The statements are built once, in
``sqlqueue.storage.statements.membership``; these methods run them and shape the rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db.backends.utils import CursorWrapper

from sqlqueue.storage.sql.tables import VendorHooks

#: (partition, owner, generation, ms since renewal)
LeaseRow = tuple[str, str, int, int]


def _lease_rows(rows: Sequence[Sequence[Any]]) -> list[LeaseRow]:
    return [(r[0], r[1], int(r[2]), int(r[3])) for r in rows]


class MembershipAccess(VendorHooks):
    """Mixin for ``Store``: leases, heartbeats and pauses."""

    # leases -------------------------------------------------------------------------------
    def acquire_leases(
        self, cursor: CursorWrapper, group: str, topic: str, partitions: Sequence[str],
        owner: str, duration_ms: int,
    ) -> None:
        """``acquire_leases`` (sqlqueue.storage.statements.membership)."""
        if partitions:
            cursor.execute(*self.sql.acquire_leases(group, topic, partitions, owner,
                                                    duration_ms))

    def renew_leases(
        self, cursor: CursorWrapper, group: str, topic: str, owner: str,
        held: Mapping[str, int],
    ) -> int:
        """``renew_leases``: how many of the leases ``owner`` holds (partition ->
        generation) it still held, and extended."""
        if not held:
            return 0
        cursor.execute(*self.sql.renew_leases(group, topic, owner, held))
        return int(cursor.rowcount)

    def list_leases(
        self, cursor: CursorWrapper, group: str, topic: str, *, lock: bool = False,
        partitions: Sequence[str] | None = None,
    ) -> list[LeaseRow]:
        """``list_leases``: (partition, owner, generation, ms since renewal)."""
        cursor.execute(*self.sql.list_leases(group, topic, lock=lock, partitions=partitions))
        return _lease_rows(cursor.fetchall())

    def fence_leases(
        self, cursor: CursorWrapper, group: str, topic: str, partitions: Sequence[str],
    ) -> tuple[list[LeaseRow], str | None]:
        """``fence_leases``: ``list_leases`` of ``partitions``, share-locked until commit,
        and which server answered (None: no row, nothing to fence)."""
        cursor.execute(*self.sql.list_leases(group, topic, lock=True, partitions=partitions,
                                             with_server=self.server_identity_sql))
        rows = cursor.fetchall()
        server = str(rows[0][4]) if rows else None
        return _lease_rows(rows), server

    def release_leases(
        self, cursor: CursorWrapper, group: str, topic: str, partitions: Sequence[str],
        owner: str,
    ) -> int:
        """``release_leases``: give partitions up (only those ``owner`` holds)."""
        if not partitions:
            return 0
        cursor.execute(*self.sql.release_leases(group, topic, owner, partitions))
        return int(cursor.rowcount)

    def purge_abandoned(
        self, cursor: CursorWrapper, group: str, topic: str, older_than_ms: int
    ) -> None:
        """``purge_abandoned``: forget leases and heartbeats nobody renewed for long."""
        for statement in self.sql.purge_abandoned(group, topic, older_than_ms):
            cursor.execute(*statement)

    # heartbeats ---------------------------------------------------------------------------
    def heartbeat(self, cursor: CursorWrapper, group: str, topic: str, name: str) -> None:
        """``heartbeat``: this subscriber is alive (database time)."""
        cursor.execute(*self.sql.heartbeat(group, topic, name))

    def live_subscribers(
        self, cursor: CursorWrapper, group: str, topic: str, within_ms: int
    ) -> list[str]:
        """``live_subscribers``: names with a heartbeat in the last ``within_ms``."""
        cursor.execute(*self.sql.live_subscribers(group, topic, within_ms))
        return [r[0] for r in cursor.fetchall()]

    def deregister(self, cursor: CursorWrapper, group: str, topic: str, name: str) -> None:
        """``deregister``: a graceful goodbye, so the others rebalance at once."""
        cursor.execute(*self.sql.deregister(group, topic, name))

    # flow control ----------------------------------------------------------------------------
    def list_pauses(self, cursor: CursorWrapper) -> list[tuple[str, str]]:
        """``list_pauses``: every pause, as (group, topic); "" matches any."""
        cursor.execute(*self.sql.list_pauses())
        return [(str(group), str(topic)) for group, topic in cursor.fetchall()]

    # runner control (issue 42) ----------------------------------------------------------------
    def runner_request(self, cursor: CursorWrapper, name: str) -> tuple[str, str, int] | None:
        """``runner_request``: (action, requested_by, requested_at) not yet obeyed."""
        cursor.execute(*self.sql.runner_request(name))
        row = cursor.fetchone()
        return None if row is None else (str(row[0]), str(row[1]), int(row[2]))

    def obey_runner_request(self, cursor: CursorWrapper, name: str, requested_at: int) -> bool:
        """``obey_runner_request``: stamp it obeyed; False if it was replaced meanwhile."""
        cursor.execute(*self.sql.obey_runner_request(name, requested_at))
        return bool(cursor.rowcount)
