"""Named statements of a server change (a failover): the record of which server granted
the leases and deliveries of a database, and voiding what the old server granted, so that
the new primary serves every partition at once instead of waiting out the old leases
(``LEASE_DURATION``) and deliveries (``VISIBILITY_TIMEOUT``). Run by
``sqlqueue.consuming.takeover``.

The record is one row of ``queue_partition_leases`` under the empty consumer group (no
subscription has one): ``leased_by`` names the server (a digest of its identity). It is
replicated with the leases it speaks for, so a promoted replica still names the old
primary until the first runner that noticed the change voids and renames it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlqueue.storage.statements.tables import (
    GROUP_KEY,
    HEARTBEATS_TABLE,
    LEASES_TABLE,
    STATE_TABLE,
)
from sqlqueue.storage.statements.vendors import Statement, Vendor

#: the key of the server record in queue_partition_leases (group, topic, partition)
SERVER_RECORD_KEY = ("", "", "")


class FailoverStatements(Vendor):
    """The server record and the voids (a mixin of ``Statements``)."""

    def _record_where(self) -> str:
        return " AND ".join(f"{self.quote(c)} = {self.text_mark}" for c in GROUP_KEY)

    def ensure_server_record(self) -> Statement:
        """``ensure_server_record``: create the server record, naming no server (''),
        unless it exists."""
        q = self.quote
        columns = (*GROUP_KEY, "leased_by", "leased_at", "lease_renewed_at", "generation")
        now = self.now_ms_sql
        return (
            f"INSERT INTO {q(LEASES_TABLE)} ({self.names(columns)}) "
            f"VALUES (%s, %s, %s, '', {now}, {now}, 0) "
            f"{self.insert_if_absent_suffix(GROUP_KEY)}",
            list(SERVER_RECORD_KEY),
        )

    def record_server(self, server: str, replacing: Sequence[str] | None = None) -> Statement:
        """``record_server``: the server record names ``server`` from now on; only if it
        named one of ``replacing`` (when given), else if it named any other. One row
        matches when it changed (the row stays locked until commit)."""
        q = self.quote
        if replacing is None:
            condition, params = f"{q('leased_by')} <> {self.text_mark}", [server]
        else:
            condition, params = f"{q('leased_by')} IN ({self.text_marks(len(replacing))})", [
                *replacing]
        return (
            f"UPDATE {q(LEASES_TABLE)} SET {q('leased_by')} = %s, "
            f"{q('lease_renewed_at')} = {self.now_ms_sql} "
            f"WHERE {self._record_where()} AND {condition}",
            [server, *SERVER_RECORD_KEY, *params],
        )

    def read_server_record(self) -> Statement:
        """``read_server_record``: the server the record names ('' for none; no row
        before a runner first ran)."""
        q = self.quote
        return (f"SELECT {q('leased_by')} FROM {q(LEASES_TABLE)} WHERE {self._record_where()}",
                list(SERVER_RECORD_KEY))

    def void_leases(self) -> Statement:
        """``void_leases``: every lease expires now, under a new generation, so that a
        subscriber still holding one of the old server's cannot write as its owner
        (fencing) and any subscriber may acquire it at once."""
        q = self.quote
        return (
            f"UPDATE {q(LEASES_TABLE)} SET {q('lease_renewed_at')} = 0, "
            f"{q('generation')} = {q('generation')} + 1 "
            f"WHERE {q('consumer_group')} <> {self.text_mark}",
            [SERVER_RECORD_KEY[0]],
        )

    def void_heartbeats(self) -> Statement:
        """``void_heartbeats``: no subscriber counts as alive until it heartbeats on this
        server, so that the fair shares are those of the subscribers that reached it (a
        subscriber that died with the old server no longer keeps a share unserved)."""
        q = self.quote
        return (f"UPDATE {q(HEARTBEATS_TABLE)} SET {q('heartbeat_at')} = 0 "
                f"WHERE {q('heartbeat_at')} > %s", [0])

    def void_deliveries(self) -> Statement:
        """``void_deliveries``: deliveries in flight become visible at once. Only rows
        without an error: a row with one may be a retry waiting out its backoff, which
        stays (an in-flight redelivery of a failed message then waits for its
        visibility timeout, as before)."""
        q = self.quote
        return (
            f"UPDATE {q(STATE_TABLE)} SET {q('invisible_until')} = 0 "
            f"WHERE NOT {q('acked')} AND {q('last_error')} = {self.text_mark} "
            f"AND {q('invisible_until')} > {self.now_ms_sql}",
            [""],
        )
